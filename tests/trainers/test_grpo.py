"""MultiTurnGRPOTrainer: trains on real TextWorld games; env_mask keeps observations out of the loss."""

import math

import pytest
import torch
from conftest import tiny_rl_args
from datasets import Dataset
from toy_envs import CountingEnv, FlakyEnv, reply_characters

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
from trl_multiturn.envs import TextWorldEnv

pytestmark = pytest.mark.filterwarnings("ignore::jericho.UnsupportedGameWarning")


def make_trainer(model, tmp_path, env_factory, rows, reward_funcs=None, **overrides):
    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, **overrides)
    return MultiTurnGRPOTrainer(model=model, args=args, environment_factory=env_factory,
                                train_dataset=Dataset.from_list(list(rows)), reward_funcs=reward_funcs)


def test_trains_on_generated_textworld_games(tiny_chatml_model, tmp_path, textworld_train_tasks, textworld_games_dir):
    trainer = make_trainer(tiny_chatml_model, tmp_path, lambda: TextWorldEnv(games_dir=str(textworld_games_dir)),
                           textworld_train_tasks, reward_funcs=[reply_characters], reward_mode="dense")
    before = [p.detach().clone() for p in trainer.model.parameters()]
    result = trainer.train()
    assert trainer.state.global_step == 2 and math.isfinite(result.training_loss)
    logged = [log for log in trainer.state.log_history if "episodes/success_rate" in log]
    assert len(logged) == 2 and all(log["episodes/failed"] == 0 for log in logged)
    # TRL's metric names, from the multi-turn step (TRL's own scoring path never runs)
    trl_names = {"reward", "reward_std", "frac_reward_zero_std", "num_tokens", "entropy", "clip_ratio/region_mean",
                 "completions/mean_length", "completions/max_length", "completions/clipped_ratio",
                 "rewards/environment_return/mean", "rewards/reply_characters/mean"}
    assert all(trl_names <= set(log) for log in logged), trl_names - set(logged[0])
    assert all(0 < log["episodes/trained_token_fraction"] < 1 for log in logged)
    # The runner is public and usable outside train() on dataset rows.
    episodes = trainer.episode_runner([textworld_train_tasks[0]])
    assert episodes[0].num_turns >= 1 and episodes[0].observations
    assert any(log["credit/zero_advantage_groups"] < 1 for log in logged)  # some group carried signal...
    assert any(not torch.equal(b, a) for b, a in zip(before, trainer.model.parameters()))  # ...and it was learned


def _scored_batch(trainer, rows):
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop, read by _compute_loss
    return trainer._generate_and_score_completions(list(rows))


def test_advantages_live_only_on_sampled_tokens_and_observations_do_not_move_the_loss(tiny_chatml_model, tmp_path):
    # Turn k earns reward k; the winning episodes differ in length, so groups carry signal.
    trainer = make_trainer(tiny_chatml_model, tmp_path, CountingEnv, [{"target": 2}] * 4, reward_mode="dense",
                           action_parser="trl_multiturn.rollout.parsing:whole_reply")
    rows = [{"target": 1}, {"target": 1}, {"target": 3}, {"target": 3}]
    torch.manual_seed(0)
    inputs = _scored_batch(trainer, rows)
    mask = inputs["completion_mask"] * inputs["tool_mask"]
    assert inputs["advantages"].shape == inputs["completion_ids"].shape
    assert torch.all(inputs["advantages"][mask == 0] == 0)
    inputs["advantages"] = torch.where(mask.bool(), torch.randn_like(inputs["advantages"]), inputs["advantages"])
    base = trainer._compute_loss(trainer.model, inputs).item()
    # Any advantage on an observation/template position leaves the loss unchanged...
    perturbed = dict(inputs, advantages=torch.where(mask.bool(), inputs["advantages"], torch.full_like(mask, 7.0,
                                                                                                       dtype=torch.float)))
    assert trainer._compute_loss(trainer.model, perturbed).item() == pytest.approx(base, abs=1e-6)
    # ...while one on a sampled position moves it (so the check above can fail).
    first_sampled = mask[0].nonzero()[0].item()
    moved = dict(inputs, advantages=inputs["advantages"].clone())
    moved["advantages"][0, first_sampled] += 5.0
    assert trainer._compute_loss(trainer.model, moved).item() != pytest.approx(base, abs=1e-6)


def test_the_logs_hold_the_environment_return_and_the_shaped_return_apart(tiny_chatml_model, tmp_path):
    """`episodes/mean_return` is the environment's (as `evaluate` reports it), `episodes/mean_shaped_return` the
    one under `reward_mode` that the credit sees: with 'sparse' and success_reward=5 they differ."""
    trainer = make_trainer(tiny_chatml_model, tmp_path, CountingEnv, [{"target": 2}] * 4, reward_mode="sparse",
                           success_reward=5.0, action_parser="trl_multiturn.rollout.parsing:whole_reply")
    _scored_batch(trainer, [{"target": 1}, {"target": 1}, {"target": 2}, {"target": 2}])
    episodes = trainer.last_rollout.episodes
    metrics = trainer._metrics["train"]
    assert metrics["episodes/mean_return"][-1] == pytest.approx(sum(sum(ep.turn_rewards) for ep in episodes) / 4)
    assert metrics["episodes/mean_shaped_return"][-1] == pytest.approx(sum(5.0 * ep.won for ep in episodes) / 4)
    assert metrics["episodes/mean_return"][-1] != metrics["episodes/mean_shaped_return"][-1]


def test_a_failed_environment_is_dropped_from_the_baseline_and_the_loss(tiny_chatml_model, tmp_path):
    trainer = make_trainer(tiny_chatml_model, tmp_path, FlakyEnv, [{"target": 1, "mode": "ok"}] * 4,
                           reward_mode="dense", action_parser="trl_multiturn.rollout.parsing:whole_reply")
    rows = [{"target": 1, "mode": "raise"}, {"target": 1, "mode": "ok"}, {"target": 2, "mode": "ok"},
            {"target": 2, "mode": "ok"}]
    inputs = _scored_batch(trainer, rows)
    loss_mask = inputs["completion_mask"] * inputs["tool_mask"]
    assert loss_mask[0].sum() == 0 and torch.all(inputs["advantages"][0] == 0)
    # Episode 1 is alone in its group once episode 0 failed: no baseline, no advantage (not scored as 0 vs 1).
    assert torch.all(inputs["advantages"][1] == 0)
    assert trainer._metrics["train"]["episodes/failed"][-1] == 1


def test_trajectory_reward_funcs_are_added_on_the_final_turn(tiny_chatml_model, tmp_path):
    seen = {}

    def length_bonus(prompts, completions, won, **kwargs):
        seen["won"] = won
        seen["roles"] = [m["role"] for m in completions[0]]
        return [float(len(c)) for c in completions]

    trainer = make_trainer(tiny_chatml_model, tmp_path, CountingEnv, [{"target": 1}] * 4, reward_funcs=length_bonus,
                           advantage_estimator="rloo", action_parser="trl_multiturn.rollout.parsing:whole_reply")
    inputs = _scored_batch(trainer, [{"target": 1}, {"target": 1}, {"target": 1}, {"target": 3}])
    assert seen["won"] == [True] * 4 and seen["roles"][0] == "assistant"
    # Sparse returns are equal (all won); only the whole-episode reward func separates the 3-turn episode.
    adv = inputs["advantages"]
    assert torch.all(adv[:2] == 0) and adv[2].abs().sum() > 0 and (adv[3] != 0).any()


@pytest.mark.parametrize("field,value,message", [
    ("reward_mode", "verbose", "reward_mode='verbose'"),
    ("advantage_estimator", "magic", "advantage_estimator='magic'"),
    ("max_turns", 0, "max_turns=0"),
])
def test_bad_config_names_the_field(tmp_path, field, value, message):
    with pytest.raises(ValueError, match=message):
        tiny_rl_args(MultiTurnGRPOConfig, tmp_path, **{field: value})


def test_environment_factory_is_required(tiny_chatml_model, tmp_path):
    with pytest.raises(ValueError, match="environment_factory is required"):
        make_trainer(tiny_chatml_model, tmp_path, None, [{"target": 1}] * 4)


def test_estimator_kwargs_reach_the_estimator(tiny_chatml_model, tmp_path):
    from trl_multiturn.credit import CreditBatch
    from trl_multiturn.credit.estimators import gigpo

    batch = CreditBatch.from_lists([[0.0, 1.0], [0.0, 0.0], [1.0]], group_ids=[0, 0, 0], valid=[True] * 3,
                                   observations=[["start", "hall"], ["start", "hall"], ["start"]])
    trainer = make_trainer(tiny_chatml_model, tmp_path, CountingEnv, [{"target": 1}] * 4,
                           advantage_estimator="gigpo", estimator_kwargs='{"step_weight": 0.25}')
    assert torch.allclose(trainer.step.credit.turn_advantages(batch), gigpo(batch, step_weight=0.25))
    assert not torch.allclose(gigpo(batch, step_weight=0.25), gigpo(batch))


@pytest.mark.parametrize("config_name", ["MultiTurnGRPOConfig", "MultiTurnRLOOConfig", "MultiTurnPPOConfig",
                                         "MultiTurnSFTConfig"])
def test_configs_use_bf16_only_where_the_hardware_has_it(config_name, tmp_path):
    from transformers.utils import is_torch_bf16_gpu_available

    import trl_multiturn

    config_cls = getattr(trl_multiturn, config_name)
    assert config_cls(output_dir=str(tmp_path)).bf16 == is_torch_bf16_gpu_available()
    if not is_torch_bf16_gpu_available():  # an explicit request is still TRL's to refuse
        with pytest.raises(ValueError, match="bf16"):
            config_cls(output_dir=str(tmp_path), bf16=True)


def every_other_length(reply: str) -> str | None:
    """Action parser that cannot read replies of odd length (about half of a random model's), so that episodes
    skip environment steps at random turns."""
    return None if len(reply) % 2 else (reply.strip() or "wait")


def test_gigpo_anchors_a_turn_at_the_environment_state_even_after_an_unreadable_reply(tiny_chatml_model, tmp_path):
    # CountingEnv's state is its step count. An unreadable reply does not step it: the next turn starts from the same
    # state, though the model is shown the UNREADABLE_REPLY text. Reference: replay every episode's actions in a fresh
    # environment, key each turn by the true state, and compute GiGPO (scale off) by brute force.
    from trl_multiturn.rollout.runner import UNREADABLE_REPLY

    trainer = make_trainer(tiny_chatml_model, tmp_path, CountingEnv, [{"target": 9}] * 8, reward_mode="dense",
                           advantage_estimator="gigpo", scale_rewards="none", max_turns=4,
                           per_device_train_batch_size=8, num_generations=4,
                           action_parser=f"{__name__}:every_other_length")
    torch.manual_seed(0)
    inputs = _scored_batch(trainer, [{"target": 9}] * 8)
    episodes = trainer.last_rollout.episodes
    skipped = [k for ep in episodes for k, a in enumerate(ep.actions[:-1]) if a is None]
    assert skipped, "no turn followed an unreadable reply: the test would not exercise the fix"
    shown = [ep.observations[k] for ep in episodes for k, a in enumerate(ep.actions) if a is None]
    assert set(shown) == {UNREADABLE_REPLY}  # what the model saw is kept; only the anchor is the real state

    states, returns = [], []
    for ep in episodes:
        env, seen = CountingEnv(), []
        env.reset(ep.task)
        for action in ep.actions:
            seen.append(env.turn)
            if action is not None:
                env.step(action)
        states.append(seen)
        returns.append([sum(ep.turn_rewards[k:]) for k in range(ep.num_turns)])
    groups = [i // 4 for i in range(8)]
    anchor_returns: dict[tuple, list[float]] = {}
    for i in range(8):
        for k, state in enumerate(states[i]):
            anchor_returns.setdefault((groups[i], state), []).append(returns[i][k])
    for i, ep in enumerate(episodes):
        group_returns = [returns[j][0] for j in range(8) if groups[j] == groups[i]]
        episode_term = returns[i][0] - sum(group_returns) / len(group_returns)
        for k, (start, end) in enumerate(ep.turn_spans):
            anchor = anchor_returns[(groups[i], states[i][k])]
            expected = episode_term + returns[i][k] - sum(anchor) / len(anchor)
            assert inputs["advantages"][i, start:end].tolist() == pytest.approx([expected] * (end - start), abs=1e-5)


def test_the_reference_model_is_the_policy_object_as_given(tiny_chatml_model, tmp_path):
    # A policy changed in memory after loading (e.g. just fine-tuned): with beta > 0 the KL must anchor to these
    # weights, not to the checkpoint at config._name_or_path.
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(tiny_chatml_model)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.1)
    trainer = make_trainer(policy, tmp_path, CountingEnv, [{"target": 1}] * 4, beta=0.1)
    ref = trainer.accelerator.unwrap_model(trainer.ref_model)
    policy_params = dict(trainer.accelerator.unwrap_model(trainer.model).named_parameters())
    ref_params = dict(ref.named_parameters())
    assert ref is not policy and ref_params.keys() == policy_params.keys()
    assert max((ref_params[n] - p).abs().max().item() for n, p in policy_params.items()) == 0.0


class NoTaskLoads(CountingEnv):
    """Every row fails `reset` (a task set the environment cannot read)."""

    def reset(self, task):
        from trl_multiturn.envs import TaskError

        raise TaskError(f"task {task!r} names no game file: give 'game_file'")


def test_a_run_whose_every_episode_fails_stops_with_the_reason(tiny_chatml_model, tmp_path):
    from trl_multiturn.trainers.step import EpisodesFailedError

    trainer = make_trainer(tiny_chatml_model, tmp_path, NoTaskLoads, [{"target": 1}] * 4, max_steps=10,
                           max_failed_steps=2)
    with pytest.raises(EpisodesFailedError, match="in 2 training steps in a row.*names no game file"):
        trainer.train()
    assert trainer.state.global_step == 1  # the first all-failed step ran (with no loss), the second stopped it


def test_a_run_with_some_episodes_left_trains_on(tiny_chatml_model, tmp_path):
    # one task of the two raises in its first step: half the episodes fail in every step, never all of them
    trainer = make_trainer(tiny_chatml_model, tmp_path, FlakyEnv, [{"target": 2, "mode": "raise"}, {"target": 2}],
                           max_steps=2, max_failed_steps=1)
    trainer.train()
    assert trainer.state.global_step == 2 and trainer.step.failed_steps == 0
    logged = [log["episodes/failed"] for log in trainer.state.log_history if "episodes/failed" in log]
    assert logged == [2.0, 2.0]


def test_the_offline_default_model_name_works_in_python(tiny_chatml_model, tmp_path, monkeypatch):
    import trl_multiturn.models

    # The offline checkpoint the name resolves to (here the tiny model, so the test needs no 135M weights).
    monkeypatch.setattr(trl_multiturn.models, "offline_default_model", lambda: tiny_chatml_model)
    trainer = make_trainer("offline:smollm2-135m-instruct", tmp_path, CountingEnv, [{"target": 1}] * 4)
    assert trainer.model.name_or_path == tiny_chatml_model
