"""MultiTurnRLOOTrainer: trains on real TextWorld games; leave-one-out baselines over each task's episodes; env_mask
keeps observation tokens out of the sequence log-probability, the KL penalty and the loss."""

import math

import pytest
import torch
from conftest import tiny_rl_args
from datasets import Dataset
from toy_envs import CountingEnv, reply_characters
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_multiturn import Environment, MultiTurnRLOOConfig, MultiTurnRLOOTrainer, StepResult
from trl_multiturn.credit import CreditBatch, get_estimator
from trl_multiturn.envs import TextWorldEnv
from trl_multiturn.trainers.estimator_credit import turn_kl_penalties
from trl_multiturn.trainers.rloo import check_one_advantage_per_episode

pytestmark = pytest.mark.filterwarnings("ignore::jericho.UnsupportedGameWarning")


def any_reply(reply: str) -> str:
    """Action parser that reads every reply, so a test's returns do not depend on what the random model says."""
    return reply.strip() or "wait"


ANY_REPLY = f"{__name__}:any_reply"


class FixedReturnEnv(Environment):
    """One turn, whose reward is the task's `return`."""

    def reset(self, task):
        self.value = task["return"]
        return "Say anything."

    def step(self, action):
        return StepResult("Done.", reward=self.value, done=True, won=True)


def make_trainer(model, tmp_path, env_factory, rows, processing_class=None, reward_funcs=None, **overrides):
    args = tiny_rl_args(MultiTurnRLOOConfig, tmp_path, **overrides)
    return MultiTurnRLOOTrainer(model, args=args, environment_factory=env_factory, processing_class=processing_class,
                                train_dataset=Dataset.from_list(list(rows)), reward_funcs=reward_funcs)


def scored(trainer, rows):
    trainer.model.train()
    return trainer._generate_and_score_completions(list(rows))


def test_trains_on_generated_textworld_games(tiny_chatml_model, tmp_path, textworld_train_tasks, textworld_games_dir):
    # TRL's default beta=0.05: the reference model is built and the KL penalty enters the rewards.
    trainer = make_trainer(tiny_chatml_model, tmp_path, lambda: TextWorldEnv(games_dir=str(textworld_games_dir)),
                           textworld_train_tasks, reward_funcs=[reply_characters], reward_mode="dense")
    assert trainer.beta == 0.05 and trainer.ref_model is not None
    before = [p.detach().clone() for p in trainer.model.parameters()]
    result = trainer.train()
    assert trainer.state.global_step == 2 and math.isfinite(result.training_loss)
    logged = [log for log in trainer.state.log_history if "episodes/success_rate" in log]
    assert len(logged) == 2 and all(log["episodes/failed"] == 0 for log in logged)
    assert all(0 < log["episodes/trained_token_fraction"] < 1 and math.isfinite(log["kl"]) for log in logged)
    assert any(log["credit/zero_advantage_groups"] < 1 for log in logged)  # some group carried signal...
    assert any(not torch.equal(b, a) for b, a in zip(before, trainer.model.parameters()))  # ...and it was learned


def test_leave_one_out_advantages_on_a_hand_made_group():
    # Group 0: returns 1, 3, 6, 6 spread over different numbers of turns. Group 1: returns 2, (failed), 4.
    batch = CreditBatch.from_lists(
        [[1.0], [1.0, 2.0], [1.0, 2.0, 3.0], [0.0, 0.0, 6.0], [2.0], [5.0], [4.0]],
        group_ids=[0, 0, 0, 0, 1, 1, 1], valid=[True, True, True, True, True, False, True],
    )
    adv = get_estimator("rloo")(batch)
    # A_i = R_i - mean of the other valid returns of the group, on every turn of episode i.
    expected = [1 - (3 + 6 + 6) / 3, 3 - (1 + 6 + 6) / 3, 6 - (1 + 3 + 6) / 3, 6 - (1 + 3 + 6) / 3, 2 - 4, 0.0, 4 - 2]
    for i, value in enumerate(expected):
        turns = batch.turn_mask[i]
        assert torch.allclose(adv[i][turns], torch.full((int(turns.sum()),), float(value))), i
        assert torch.all(adv[i][~turns] == 0)


def test_trainer_advantages_are_leave_one_out_and_the_reference_is_a_copy_of_the_policy(tiny_chatml_model,
                                                                                       tmp_path):
    policy = AutoModelForCausalLM.from_pretrained(tiny_chatml_model)
    policy.config._name_or_path = "nowhere/not-a-checkpoint"  # TRL would try to reload the reference from here
    tokenizer = AutoTokenizer.from_pretrained(tiny_chatml_model)
    trainer = make_trainer(policy, tmp_path, FixedReturnEnv, [{"return": 0.0}] * 4, num_generations=4, beta=0.1,
                           reward_mode="dense", action_parser=ANY_REPLY, processing_class=tokenizer)
    ref = trainer.accelerator.unwrap_model(trainer.ref_model)
    assert ref is not trainer.model
    assert all(torch.equal(a, b) for a, b in zip(ref.state_dict().values(), policy.state_dict().values()))
    inputs = scored(trainer, [{"return": r} for r in (1.0, 3.0, 6.0, 6.0)])
    mask = inputs["tool_mask"].bool()
    # Policy == reference at the first step, so the KL penalty is 0 and the advantages are exactly leave-one-out.
    for i, value in enumerate([-4.0, 3 - 13 / 3, 6 - 10 / 3, 6 - 10 / 3]):
        assert torch.allclose(inputs["advantages"][i][mask[i]], torch.tensor(value)), i
    assert torch.all(inputs["advantages"][~mask] == 0)


@pytest.mark.parametrize("granularity", ["episode", "turn"])
def test_observation_tokens_never_enter_the_sequence_log_probability_or_the_loss(tiny_chatml_model, tmp_path,
                                                                                 granularity):
    trainer = make_trainer(tiny_chatml_model, tmp_path, CountingEnv, [{"target": 3}] * 4, beta=0.0,
                           loss_granularity=granularity, action_parser=ANY_REPLY)
    torch.manual_seed(0)
    inputs = scored(trainer, [{"target": 3}] * 4)
    env_mask, attended = inputs["tool_mask"].bool(), inputs["completion_mask"].bool()
    # Observation tokens are attended to (completion_mask) but are not the model's (env_mask).
    assert (attended & ~env_mask).any() and (env_mask & ~attended).sum() == 0
    # One advantage per episode (or per turn), so that the loss depends on every sampled token.
    inputs["advantages"] = torch.where(env_mask, torch.randn(4, 1), 0.0)
    base = trainer._compute_loss(trainer.model, inputs).item()

    def loss_with(per_token_shift=None, **changes):
        original = trainer._get_per_token_logps_and_entropies

        def shifted(*args, **kwargs):
            logps, entropies, aux = original(*args, **kwargs)
            return logps + per_token_shift, entropies, aux

        if per_token_shift is not None:
            trainer._get_per_token_logps_and_entropies = shifted
        try:
            return trainer._compute_loss(trainer.model, dict(inputs, **changes)).item()
        finally:
            trainer._get_per_token_logps_and_entropies = original

    noise = torch.where(env_mask, 0.0, 50 * torch.randn(env_mask.shape))
    # Log-probabilities, old log-probabilities and advantages at observation/padding positions change nothing...
    assert loss_with(per_token_shift=noise) == pytest.approx(base, abs=1e-6)
    assert loss_with(old_per_token_logps=inputs["old_per_token_logps"] + noise) == pytest.approx(base, abs=1e-6)
    assert loss_with(advantages=inputs["advantages"] + noise) == pytest.approx(base, abs=1e-6)
    # ...while the same change on one sampled token does (so the checks above can fail).
    one = torch.zeros(env_mask.shape)
    one[0, env_mask[0].nonzero()[0].item()] = 0.1
    assert loss_with(per_token_shift=one) != pytest.approx(base, abs=1e-6)


def test_the_kl_penalty_counts_only_sampled_tokens(tiny_chatml_model, tmp_path):
    trainer = make_trainer(tiny_chatml_model, tmp_path, CountingEnv, [{"target": 3}] * 4, beta=0.5,
                           action_parser=ANY_REPLY)
    inputs = scored(trainer, [{"target": 3}] * 4)
    env_mask = inputs["tool_mask"].bool()
    old = inputs["old_per_token_logps"]
    ref = old - torch.rand(old.shape)  # a policy that drifted from its reference
    penalties = turn_kl_penalties(trainer.last_rollout, old, ref, inputs["tool_mask"], trainer.beta)
    ep = trainer.last_rollout.episodes[0]
    start, end = ep.turn_spans[1]
    assert len(penalties[0]) == ep.num_turns >= 2
    assert penalties[0][1] == pytest.approx(0.5 * (old - ref)[0, start:end].sum().item(), rel=1e-5)
    moved_outside = torch.where(env_mask, ref, ref - 100.0)
    assert turn_kl_penalties(trainer.last_rollout, old, moved_outside, inputs["tool_mask"], trainer.beta) == penalties


def test_turn_level_estimators_need_turn_level_ratios(tiny_chatml_model, tmp_path):
    # Turn k earns reward k: with turn_rloo the turns of one episode get different advantages.
    rows = [{"target": 3}, {"target": 2}]
    turn = make_trainer(tiny_chatml_model, tmp_path, CountingEnv, rows * 2, beta=0.0, reward_mode="dense",
                        advantage_estimator="turn_rloo", loss_granularity="turn", action_parser=ANY_REPLY,
                        num_generations=2, per_device_train_batch_size=2)
    inputs = scored(turn, rows)
    spans = turn.last_rollout.episodes[0].turn_spans
    advantages = inputs["advantages"][0]
    # Returns-to-go 6, 5, 3 against the other episode's 3, 2: turns 0 and 1 get 3; turn 2, which only this episode
    # played, has no baseline and gets 0.
    for (start, end), value in zip(spans, [3.0, 3.0, 0.0]):
        assert torch.allclose(advantages[start:end], torch.tensor(value))
    assert torch.isfinite(turn._compute_loss(turn.model, inputs))

    episode = make_trainer(tiny_chatml_model, tmp_path, CountingEnv, rows * 2, beta=0.0, reward_mode="dense",
                           advantage_estimator="turn_rloo", action_parser=ANY_REPLY, num_generations=2,
                           per_device_train_batch_size=2)
    env_mask = torch.tensor([[1, 1, 0, 1, 0]])
    check_one_advantage_per_episode(torch.tensor([[0.5, 0.5, 0.0, 0.5, 0.0]]), env_mask, "turn_rloo")
    with pytest.raises(ValueError, match="loss_granularity='turn'"):
        scored(episode, [{"target": 3}, {"target": 1}])


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="loss_granularity"):
        tiny_rl_args(MultiTurnRLOOConfig, tmp_path, loss_granularity="token")
    with pytest.raises(ValueError, match="reward_clip_range"):
        tiny_rl_args(MultiTurnRLOOConfig, tmp_path, reward_clip_range=(-1.0, 1.0))
    assert tiny_rl_args(MultiTurnRLOOConfig, tmp_path).advantage_estimator == "rloo"
