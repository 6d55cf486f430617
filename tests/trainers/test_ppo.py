"""MultiTurnPPOTrainer: trains on real TextWorld games with a critic; GAE over sampled tokens only; clipped value
loss; the critic round-trips through checkpoints; observation positions never move the loss."""

import math
import os

import pytest
import torch
from conftest import tiny_rl_args
from datasets import Dataset
from toy_envs import CountingEnv
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnPPOConfig, MultiTurnPPOTrainer
from trl_multiturn.credit.gae import ValueBatch, gae, turn_gae
from trl_multiturn.envs import TextWorldEnv
from trl_multiturn.trainers.ppo import clipped_surrogate, clipped_value_loss
from trl_multiturn.trainers.value_model import (
    CRITIC_DIR,
    PolicyAndValueModel,
    base_weights_of_adapted,
    load_value_model_weights,
    save_value_model,
    token_values,
)

pytestmark = pytest.mark.filterwarnings("ignore::jericho.UnsupportedGameWarning")


def any_reply(reply: str) -> str:
    """Action parser that reads every reply, so the rewards do not depend on what the random model says."""
    return reply.strip() or "wait"


ANY_REPLY = f"{__name__}:any_reply"


def make_trainer(model, tmp_path, env_factory, rows, trainer_kwargs=None, **overrides):
    overrides.setdefault("num_generations", 1)
    args = tiny_rl_args(MultiTurnPPOConfig, tmp_path, **overrides)
    return MultiTurnPPOTrainer(model, args=args, environment_factory=env_factory,
                               train_dataset=Dataset.from_list(list(rows)), **(trainer_kwargs or {}))


def scored(trainer, rows):
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop, read by _compute_loss
    return trainer._generate_and_score_completions(list(rows))


def critic_state(trainer):
    return {k: v.detach().clone() for k, v in trainer.unwrapped_critic.state_dict().items()}


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def reply_count(completions, **kwargs):
    """A trajectory-level reward: the number of replies in the episode."""
    return [float(sum(m["role"] == "assistant" for m in c)) for c in completions]


def test_trains_on_textworld_and_a_checkpoint_round_trips_the_critic(tiny_chatml_model, tmp_path,
                                                                    textworld_train_tasks, textworld_games_dir):
    def env():
        return TextWorldEnv(games_dir=str(textworld_games_dir))

    # The random policy scores nothing in the games: a trajectory reward gives the critic returns to fit.
    trainer = make_trainer(tiny_chatml_model, tmp_path / "a", env, textworld_train_tasks, reward_mode="dense",
                           per_device_train_batch_size=2, max_steps=1, save_strategy="steps", save_steps=1,
                           trainer_kwargs={"reward_funcs": [reply_count]})
    assert trainer.ref_model is not None and trainer.beta == 0.0  # kl_coef=0.05 folds the KL into the reward
    initial = critic_state(trainer)
    result = trainer.train()
    assert trainer.state.global_step == 1 and math.isfinite(result.training_loss)
    logged = [log for log in trainer.state.log_history if "critic/value_loss" in log]
    assert len(logged) == 1 and all(math.isfinite(log["critic/value_loss"]) for log in logged)
    assert all(log["episodes/failed"] == 0 and 0 < log["episodes/trained_token_fraction"] < 1 for log in logged)
    trained = critic_state(trainer)
    assert not same_weights(initial, trained)  # the value loss trains the critic

    checkpoint = tmp_path / "a" / "checkpoint-1"
    saved = AutoModelForTokenClassification.from_pretrained(checkpoint / CRITIC_DIR)
    assert same_weights(trained, saved.state_dict())
    assert os.path.exists(checkpoint / "model.safetensors")  # the policy, where TRL puts it

    # A fresh trainer (another seed, an untrained critic) gets the critic and its optimizer state back on resume.
    resumed = make_trainer(tiny_chatml_model, tmp_path / "b", env, textworld_train_tasks, reward_mode="dense",
                           per_device_train_batch_size=2, max_steps=1, seed=1,
                           trainer_kwargs={"reward_funcs": [reply_count]})
    assert not same_weights(critic_state(resumed), trained)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert same_weights(critic_state(resumed), trained)
    head, head_resumed = trainer.unwrapped_critic.score.weight, resumed.unwrapped_critic.score.weight
    assert torch.equal(trainer.optimizer.state[head]["exp_avg"], resumed.optimizer.state[head_resumed]["exp_avg"])


def test_gae_on_a_two_turn_episode_skips_the_observation_between_the_turns():
    # Tokens: turn 0 = positions 0-1, observation = 2-3, turn 1 = 4-5, padding = 6. Turn rewards on each turn's
    # last token; the critic's values at the observation and padding positions must never be used.
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0]]).bool()
    rewards = torch.tensor([[0.0, 0.5, 0.0, 0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.1, 0.2, 9.0, 9.0, 0.3, 0.4, 9.0]])
    gamma, lam = 0.9, 0.8
    # By hand, over the sampled positions 0, 1, 4, 5 (delta = r + gamma V_next - V, A = delta + gamma lam A_next):
    # A5 = 1.0 - 0.4 = 0.6;  A4 = (0.9*0.4 - 0.3) + 0.72*0.6 = 0.492
    # A1 = (0.5 + 0.9*0.3 - 0.2) + 0.72*0.492 = 0.92424;  A0 = (0.9*0.2 - 0.1) + 0.72*0.92424 = 0.7454528
    out = gae(ValueBatch(rewards, values, mask), gamma=gamma, lam=lam)
    expected = torch.tensor([[0.7454528, 0.92424, 0.0, 0.0, 0.492, 0.6, 0.0]])
    assert torch.allclose(out.advantages, expected, atol=1e-6)
    assert torch.allclose(out.returns, torch.where(mask, expected + values, 0.0), atol=1e-6)
    assert torch.equal(out.value_mask, mask)
    # The paper's gamma = lam = 1: the advantage is the reward-to-go minus the value, observations or not.
    paper = gae(ValueBatch(rewards, values, mask), gamma=1.0, lam=1.0)
    assert torch.allclose(paper.advantages[mask], torch.tensor([1.4, 1.3, 0.7, 0.6]), atol=1e-6)

    # Turn level: turn 0 (value 0.1 at its first token, reward 0.5), turn 1 (value 0.3, reward 1.0).
    # A_1 = 1.0 - 0.3 = 0.7;  A_0 = (0.5 + 0.9*0.3 - 0.1) + 0.72*0.7 = 1.174
    turns = turn_gae(ValueBatch(rewards, values, mask), gamma=gamma, lam=lam)
    assert torch.allclose(turns.advantages, torch.tensor([[1.174, 1.174, 0, 0, 0.7, 0.7, 0]]), atol=1e-6)
    assert torch.equal(turns.value_mask, torch.tensor([[True, False, False, False, True, False, False]]))
    assert torch.allclose(turns.returns[turns.value_mask], torch.tensor([1.274, 1.0]), atol=1e-6)


def test_the_value_loss_is_clipped():
    old = torch.tensor([0.0, 0.0])
    values = torch.tensor([1.0, 0.1], requires_grad=True)
    returns = torch.tensor([2.0, 0.2])
    mask = torch.tensor([True, True])
    loss, clip_fraction = clipped_value_loss(values, old, returns, mask, cliprange_value=0.2)
    # Position 0 moved by 1.0 > 0.2: V_clip = 0.2, max((1-2)^2, (0.2-2)^2) = 3.24. Position 1 is inside the range.
    assert loss.item() == pytest.approx(0.5 * (3.24 + 0.01) / 2)
    unclipped = 0.5 * ((values.detach() - returns) ** 2).mean()
    assert loss.item() != pytest.approx(unclipped.item())
    assert clip_fraction.item() == 0.5
    loss.backward()
    # The clipped branch wins at position 0, so moving that value further earns no gradient there.
    assert values.grad[0] == 0 and values.grad[1] != 0


def test_the_policy_surrogate_is_clipped_on_the_side_the_advantage_pushes():
    ratio = torch.tensor([1.5, 1.5, 0.5, 0.5, 1.1], requires_grad=True)
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0])
    loss, active = clipped_surrogate(ratio, advantages, epsilon_low=0.2, epsilon_high=0.3)
    # -min(rho A, clip(rho) A): 1.5 -> 1.3 for A > 0 (clipped); for A < 0 the unclipped 1.5 is the worse case.
    assert torch.allclose(loss.detach(), torch.tensor([-1.3, 1.5, -0.5, 0.8, -1.1]))
    assert active.tolist() == [True, False, False, True, False]
    loss.sum().backward()
    assert ratio.grad.tolist() == pytest.approx([0.0, 1.0, -1.0, 0.0, -1.0])  # no gradient where the clip holds


def test_rewards_sit_on_each_turns_last_token_and_returns_skip_observations(tiny_chatml_model, tmp_path):
    # Turn k (1-based) earns reward k; with gamma = lam = 1 and no KL, R_t = the rewards of turn(t) and later turns.
    trainer = make_trainer(tiny_chatml_model, tmp_path, CountingEnv, [{"target": 3}] * 2, reward_mode="dense",
                           kl_coef=0.0, action_parser=ANY_REPLY, per_device_train_batch_size=2)
    assert trainer.ref_model is None  # neither kl_coef nor beta: no reference model
    inputs = scored(trainer, [{"target": 3}, {"target": 2}])
    mask = (inputs["completion_mask"] * inputs["tool_mask"]).bool()
    for i, ep in enumerate(trainer.last_rollout.episodes):
        rewards = [float(k + 1) for k in range(ep.num_turns)]
        assert ep.turn_rewards == rewards
        for k, (start, end) in enumerate(ep.turn_spans):
            assert torch.allclose(inputs["returns"][i, start:end], torch.tensor(sum(rewards[k:])), atol=1e-5)
    assert torch.all(inputs["returns"][~mask] == 0) and torch.all(inputs["advantages"][~mask] == 0)
    assert (inputs["completion_mask"].bool() & ~mask).any()  # there were observation tokens to skip
    advantages = inputs["advantages"][mask]
    assert advantages.mean().abs() < 1e-5 and advantages.std().item() == pytest.approx(1.0, abs=1e-4)  # whitened


def test_observation_positions_never_move_the_loss(tiny_chatml_model, tmp_path):
    trainer = make_trainer(tiny_chatml_model, tmp_path, CountingEnv, [{"target": 3}] * 2, reward_mode="dense",
                           action_parser=ANY_REPLY, per_device_train_batch_size=2)
    inputs = scored(trainer, [{"target": 3}, {"target": 3}])
    mask = (inputs["completion_mask"] * inputs["tool_mask"]).bool()
    base = trainer._compute_loss(trainer.model, inputs).item()
    noise = torch.where(mask, 0.0, 50 * torch.randn(mask.shape))
    for key in ("advantages", "returns", "old_values"):
        assert trainer._compute_loss(trainer.model, dict(inputs, **{key: inputs[key] + noise})).item() == \
            pytest.approx(base, abs=1e-6), key
    first_sampled = mask[0].nonzero()[0].item()
    for key in ("advantages", "returns"):
        moved = inputs[key].clone()
        moved[0, first_sampled] += 5.0
        assert trainer._compute_loss(trainer.model, dict(inputs, **{key: moved})).item() != \
            pytest.approx(base, abs=1e-6), key


def test_critic_starts_from_a_policy_object_and_the_reference_is_its_copy(tiny_chatml_model, tmp_path):
    policy = AutoModelForCausalLM.from_pretrained(tiny_chatml_model)
    policy.config._name_or_path = "nowhere/not-a-checkpoint"
    trainer = make_trainer(policy, tmp_path, CountingEnv, [{"target": 2}] * 2, per_device_train_batch_size=2,
                           trainer_kwargs={"processing_class": AutoTokenizer.from_pretrained(tiny_chatml_model)})
    critic = trainer.unwrapped_critic
    backbone = policy.model.state_dict()
    assert same_weights(critic.model.state_dict(), backbone) and critic.score.out_features == 1
    ref = trainer.accelerator.unwrap_model(trainer.ref_model)
    assert ref is not policy and same_weights(ref.model.state_dict(), backbone)


def test_a_peft_critic_trains_and_round_trips(tiny_chatml_model, tmp_path):
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    trainer = make_trainer(tiny_chatml_model, tmp_path, CountingEnv, [{"target": 2}] * 2, reward_mode="dense",
                           per_device_train_batch_size=2, max_steps=1, trainer_kwargs={"peft_config": lora})
    critic = trainer.unwrapped_critic
    trainable = {n for n, p in critic.named_parameters() if p.requires_grad}
    assert any("lora_" in n for n in trainable) and any("score" in n for n in trainable)
    assert not any("embed_tokens" in n for n in trainable)
    trainer.train()
    save_value_model(critic, str(tmp_path / "out"))
    other = make_trainer(tiny_chatml_model, tmp_path / "other", CountingEnv, [{"target": 2}] * 2, seed=3,
                         per_device_train_batch_size=2, trainer_kwargs={"peft_config": lora})

    def adapter_and_head(t):  # the critic's trained weights; its frozen backbone comes from the same path
        return {n: p.detach().clone() for n, p in t.unwrapped_critic.named_parameters() if p.requires_grad}

    assert not same_weights(adapter_and_head(other), adapter_and_head(trainer))
    load_value_model_weights(other.unwrapped_critic, str(tmp_path / "out"))
    assert same_weights(adapter_and_head(other), adapter_and_head(trainer))


def test_a_peft_policy_object_gets_a_critic_from_its_base_weights_without_a_value_model(tiny_chatml_model, tmp_path):
    from peft import LoraConfig, get_peft_model

    base = AutoModelForCausalLM.from_pretrained(tiny_chatml_model)
    with torch.no_grad():
        base.model.norm.weight.add_(0.5)  # in-memory weights, not the checkpoint's: the critic must copy these
    backbone = {k: v.clone() for k, v in base.model.state_dict().items()}
    policy = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                             init_lora_weights=False))  # a non-zero adapter the critic must not get
    trainer = make_trainer(policy, tmp_path, CountingEnv, [{"target": 2}] * 2, reward_mode="dense",
                           per_device_train_batch_size=2, max_steps=1,
                           trainer_kwargs={"processing_class": AutoTokenizer.from_pretrained(tiny_chatml_model)})
    critic = trainer.unwrapped_critic
    trainable = {n for n, p in critic.named_parameters() if p.requires_grad}
    assert any("lora_" in n for n in trainable) and any("score" in n for n in trainable)  # the policy's LoRA config
    assert same_weights(base_weights_of_adapted(critic.get_base_model().model.state_dict()), backbone)
    before = critic_state(trainer)
    trainer.train()
    assert not same_weights(critic_state(trainer), before)


def test_config_allows_one_episode_per_task_and_names_bad_fields(tmp_path):
    args = tiny_rl_args(MultiTurnPPOConfig, tmp_path, num_generations=1, per_device_train_batch_size=1)
    assert args.num_generations == 1 and type(args.num_generations) is int and args.advantage_estimator == "gae"
    with pytest.raises(ValueError, match="at least 2 generations"):
        tiny_rl_args(MultiTurnGRPOConfig, tmp_path, num_generations=1, per_device_train_batch_size=1)
    with pytest.raises(ValueError, match="advantage_estimator='grpo'.*'gae'"):
        tiny_rl_args(MultiTurnPPOConfig, tmp_path, advantage_estimator="grpo")
    with pytest.raises(ValueError, match="cliprange_value"):
        tiny_rl_args(MultiTurnPPOConfig, tmp_path, cliprange_value=0.0)
    with pytest.raises(ValueError, match=r"loss_type='bnpo' \(PPO's loss is its own"):  # TRL's GRPO loss variants
        tiny_rl_args(MultiTurnPPOConfig, tmp_path, loss_type="bnpo")
    with pytest.raises(ValueError, match="load_best_model_at_end=True .*resume from that checkpoint"):
        tiny_rl_args(MultiTurnPPOConfig, tmp_path, load_best_model_at_end=True, eval_strategy="steps",
                     save_strategy="steps", eval_steps=1, save_steps=1)


def test_the_critic_gradient_is_cleared_before_each_optimizer_step(tiny_chatml_model, tmp_path):
    # Two micro-batches per optimizer step: the first backward of every step must start from no critic gradient (as
    # the policy's does), the second must find the first one's gradient (accumulation still works).
    trainer = make_trainer(tiny_chatml_model, tmp_path, CountingEnv, [{"target": 2}] * 4, reward_mode="dense",
                           action_parser=ANY_REPLY, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                           max_steps=2)
    seen = []
    training_step = trainer.training_step

    def recording_step(*args, **kwargs):
        grads = [p.grad for p in trainer.unwrapped_critic.parameters() if p.grad is not None]
        seen.append(sum(g.abs().sum().item() for g in grads))
        return training_step(*args, **kwargs)

    trainer.training_step = recording_step
    trainer.train()
    assert len(seen) == 4
    assert seen[0::2] == [0.0, 0.0], seen  # before the first backward of steps 0 and 1 (step 0's: no gradient yet)
    assert all(s > 0 for s in seen[1::2]), seen  # the second micro-batch adds to the first one's gradient


def test_a_resumed_stepwise_run_trains_the_critic_as_an_uninterrupted_one(tiny_chatml_model, tmp_path):
    """Step-wise rows through a checkpoint (the trajectory case is test_resume.py's PPO case)."""
    def train(output_dir, resume=None, **overrides):
        trainer = make_trainer(tiny_chatml_model, output_dir, CountingEnv, [{"target": 2}] * 2, reward_mode="dense",
                               action_parser=ANY_REPLY, per_device_train_batch_size=2, max_steps=3,
                               episode_format="stepwise", **overrides)
        trainer.train(resume_from_checkpoint=resume)
        return critic_state(trainer)

    uninterrupted = train(tmp_path / "a", save_strategy="steps", save_steps=2)
    resumed = train(tmp_path / "b", resume=str(tmp_path / "a" / "checkpoint-2"))
    assert same_weights(uninterrupted, resumed)


def test_critic_metrics_are_the_advantages_before_whitening_and_the_explained_variance(tiny_chatml_model, tmp_path):
    trainer = make_trainer(tiny_chatml_model, tmp_path, CountingEnv, [{"target": 3}] * 2, reward_mode="dense",
                           kl_coef=0.0, action_parser=ANY_REPLY, per_device_train_batch_size=2)
    inputs = scored(trainer, [{"target": 3}, {"target": 2}])
    mask = inputs["value_mask"]
    returns, values = inputs["returns"][mask], inputs["old_values"][mask]
    raw = returns - values  # gamma = lam = 1: the advantage before whitening is the return minus the value
    metrics = trainer._metrics["train"]
    assert metrics["credit/advantage_mean"][-1] == pytest.approx(raw.mean().item(), abs=1e-5)
    assert metrics["credit/advantage_std"][-1] == pytest.approx(raw.std().item(), abs=1e-5)
    explained = 1 - (returns - values).var(unbiased=False) / returns.var(unbiased=False)
    assert metrics["critic/explained_variance"][-1] == pytest.approx(explained.item(), abs=1e-4)
    assert metrics["critic/value_mean"][-1] == pytest.approx(values.mean().item(), abs=1e-5)


def test_a_new_value_head_starts_at_zero_and_a_saved_one_is_kept(tiny_chatml_model, tmp_path):
    # A fresh head predicts 0 everywhere (no advantage before the critic has seen a return), whether the critic is
    # copied from a policy object or loaded from a policy checkpoint; a saved critic's trained head is loaded as is.
    from trl_multiturn.trainers.value_model import create_value_model

    ids = torch.randint(0, 100, (2, 7))
    attention = torch.ones_like(ids)
    from_object = create_value_model(AutoModelForCausalLM.from_pretrained(tiny_chatml_model))
    from_path = create_value_model(tiny_chatml_model)
    for critic in (from_object, from_path):
        assert torch.equal(token_values(critic, ids, attention, 6), torch.zeros(2, 6))
        assert any(p.abs().sum() > 0 for p in critic.base_model.parameters())  # the backbone is not touched
    with torch.no_grad():
        from_path.score.weight.normal_()
    save_value_model(from_path, str(tmp_path))
    saved = create_value_model(tiny_chatml_model, str(tmp_path / CRITIC_DIR))
    assert torch.equal(saved.score.weight, from_path.score.weight)


def test_policy_and_critic_are_one_module_with_one_optimizer_at_their_learning_rates(tiny_chatml_model, tmp_path):
    # The trainer's model holds both; Trainer's one optimizer covers every trainable parameter of both exactly once,
    # the critic's at critic_learning_rate; a training step moves both through that optimizer.
    trainer = make_trainer(tiny_chatml_model, tmp_path, CountingEnv, [{"target": 2}] * 2, reward_mode="dense",
                           action_parser=ANY_REPLY, per_device_train_batch_size=2, max_steps=1, learning_rate=1e-3,
                           critic_learning_rate=5e-2)
    assert isinstance(trainer.model, PolicyAndValueModel) and trainer.model.critic is trainer.unwrapped_critic
    assert trainer.model.config is trainer.model.policy.config  # TRL sees the policy's attributes
    optimizer = trainer.create_optimizer()
    grouped = [(id(p), group["lr"]) for group in optimizer.param_groups for p in group["params"]]
    critic = {id(p) for p in trainer.model.critic.parameters() if p.requires_grad}
    policy = {id(p) for p in trainer.model.policy.parameters() if p.requires_grad}
    assert len(grouped) == len({i for i, _ in grouped}) == len(critic | policy)
    assert {lr for i, lr in grouped if i in critic} == {5e-2} and {lr for i, lr in grouped if i in policy} == {1e-3}
    trainer.optimizer = None
    before = critic_state(trainer), {k: v.clone() for k, v in trainer.model.policy.state_dict().items()}
    trainer.train()
    assert not same_weights(critic_state(trainer), before[0])
    assert not same_weights(trainer.model.policy.state_dict(), before[1])
