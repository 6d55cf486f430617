"""`max_policy_lag`: the rollout for the next step is played in the background from a snapshot of the weights at most
k optimizer steps old, corrected by truncated importance weights; every sample's lag is bounded and logged, stale
ones are dropped and counted, faults stay within their episode and resume is exact."""

import copy

import pytest
import torch
from conftest import tiny_rl_args
from datasets import Dataset
from toy_envs import ReplyScoringEnv
from transformers import AutoModelForCausalLM, TrainerCallback

from trl_multiturn import (
    MultiTurnGRPOConfig,
    MultiTurnGRPOTrainer,
    MultiTurnPPOConfig,
    MultiTurnRLOOConfig,
)
from trl_multiturn.testing import FaultyEnv
from trl_multiturn.trainers import policy_lag
from trl_multiturn.trainers.multiturn import POLICY_LAG_FILE
from trl_multiturn.trainers.policy_lag import frozen_copy, snapshot_is_due, stale_episodes

ROWS = [{"turns": 2, "id": i} for i in range(8)]  # 8 rows, 4 a step (2 tasks x num_generations=2)


def test_the_snapshot_is_refreshed_only_when_the_bound_needs_it():
    assert snapshot_is_due(0, None, 1)
    assert not snapshot_is_due(1, 0, 1) and snapshot_is_due(2, 0, 1)
    assert not snapshot_is_due(2, 0, 2) and snapshot_is_due(3, 0, 2)
    assert stale_episodes([3, 2, 1], current_version=4, max_lag=2) == [False, False, True]  # lags 1, 2, 3


def test_the_snapshot_runs_its_own_weights_not_the_live_ones(tiny_chatml_model, tmp_path):
    """TRL's fused LM head patches the policy's `forward` with a closure over the original model: a plain deep copy
    would still generate (and score) with the weights being trained."""
    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, max_policy_lag=1)
    trainer = MultiTurnGRPOTrainer(tiny_chatml_model, args=args, environment_factory=ReplyScoringEnv,
                                   train_dataset=Dataset.from_list(ROWS))
    snapshot = frozen_copy(trainer.accelerator.unwrap_model(trainer.model))
    ids = torch.tensor([[5, 9, 13, 17, 21]])
    mask = torch.ones_like(ids)

    def outputs():
        logits = snapshot(input_ids=ids, attention_mask=mask).logits  # how the rollout samples
        logps = trainer._get_per_token_logps_and_entropies(snapshot, ids, mask, 3)[0]  # its behaviour log-probs
        return logits, logps

    before = outputs()
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.mul_(0.5)
    after = outputs()
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    live = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, 3)[0]
    assert not torch.allclose(live, after[1])  # the live model did change


class Recorder(TrainerCallback):
    """The weights of every version (after each optimizer step, and before the first)."""

    def __init__(self):
        self.weights = {}

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.weights[0] = copy.deepcopy(model.state_dict())

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.weights[state.global_step] = copy.deepcopy(model.state_dict())


class RecordingTrainer(MultiTurnGRPOTrainer):
    """Keeps each step's batch and TRL's output (before TRL shuffles its rows), by the step that trains them."""

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.recorded = getattr(self, "recorded", {})
        self.recorded[self.state.global_step] = (self.last_rollout, {k: v for k, v in output.items()
                                                                     if isinstance(v, torch.Tensor)})
        return output


def run(model, output_dir, lag=1, env=ReplyScoringEnv, rows=ROWS, callbacks=(), resume=None, **overrides):
    args = tiny_rl_args(MultiTurnGRPOConfig, output_dir, max_policy_lag=lag, reward_mode="dense",
                        action_parser="trl_multiturn.rollout.parsing:whole_reply", max_completion_length=6,
                        **{"max_steps": 3, **overrides})
    trainer = RecordingTrainer(model, args=args, environment_factory=env, train_dataset=Dataset.from_list(rows),
                               callbacks=list(callbacks))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def logged(trainer, name):
    return {log["step"]: log[name] for log in trainer.state.log_history if name in log}


def sampled_logps(model, prompt_ids, completion_ids, temperature):
    """log pi(y_t | y_<t) of each completion token, one episode, no padding: computed here, not by the trainer."""
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1: -1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion_ids)[:, None])[:, 0]


@pytest.mark.parametrize("lag", [1, 2])
def test_lag_is_bounded_logged_and_corrected_by_the_probability_ratio(lag, tiny_chatml_model, tmp_path):
    recorder = Recorder()
    trainer = run(tiny_chatml_model, tmp_path, lag=lag, callbacks=[recorder], max_steps=4)
    lags = logged(trainer, "policy_lag/max")
    assert sorted(lags) == [1, 2, 3, 4]  # logged every step
    assert all(v <= lag for v in lags.values()) and max(lags.values()) == lag  # bounded, and off-policy
    assert set(logged(trainer, "policy_lag/dropped").values()) == {0.0}
    policy = AutoModelForCausalLM.from_pretrained(tiny_chatml_model)
    behaviour = AutoModelForCausalLM.from_pretrained(tiny_chatml_model)
    moved = 0
    for step, (batch, output) in trainer.recorded.items():
        assert set(batch.policy_versions) == {batch.policy_versions[0]}
        version = batch.policy_versions[0]
        assert step - version == lags[step + 1]  # what was logged is the batch's lag
        policy.load_state_dict(recorder.weights[step])
        behaviour.load_state_dict(recorder.weights[version])
        for row, ep in enumerate(batch.episodes):
            current = sampled_logps(policy, ep.prompt_ids, ep.completion_ids, trainer.temperature)
            sampled = sampled_logps(behaviour, ep.prompt_ids, ep.completion_ids, trainer.temperature)
            expected = torch.clamp(torch.exp(current - sampled), max=trainer.args.policy_lag_is_cap)
            on = torch.tensor(ep.env_mask, dtype=torch.bool)
            weights = output["importance_sampling_ratio"][row, : len(ep.completion_ids)]
            assert torch.allclose(weights[on], expected[on], rtol=1e-4, atol=1e-5)
            assert torch.all(weights[~on] == 1.0)
            moved += int((expected[on] - 1).abs().max() > 1e-3)
    assert moved  # the weights of the lagged steps are no formality


def test_a_sample_older_than_the_bound_is_dropped_and_counted(tiny_chatml_model, tmp_path, monkeypatch):
    # a snapshot never refreshed after the first: the rollout trained at step 2 comes from version 0, lag 2 > 1
    monkeypatch.setattr(policy_lag, "snapshot_is_due", lambda next_use_step, version, max_lag: version is None)
    trainer = run(tiny_chatml_model, tmp_path, lag=1)
    assert logged(trainer, "policy_lag/max") == {1: 0.0, 2: 1.0, 3: 2.0}
    assert logged(trainer, "policy_lag/dropped") == {1: 0.0, 2: 0.0, 3: 4.0}
    _, output = trainer.recorded[2]
    assert output["tool_mask"].sum() == 0 and trainer.recorded[1][1]["tool_mask"].sum() > 0  # stale: none trained


def test_a_fault_mid_episode_fails_only_its_episode(tiny_chatml_model, tmp_path):
    rows = [{"target": 2, "fault": None, "fault_turn": 2}, {"target": 2, "fault": "raise", "fault_turn": 2}]
    trainer = run(tiny_chatml_model, tmp_path, lag=1, env=FaultyEnv, rows=rows)  # every step plays both rows
    assert logged(trainer, "policy_lag/max")[3] == 1.0
    for _, (batch, _) in trainer.recorded.items():
        assert [ep.failed for ep in batch.episodes] == [bool(ep.task.get("fault")) for ep in batch.episodes]
        assert any(ep.failed for ep in batch.episodes)
        assert all(ep.won and ep.num_turns == 2 for ep in batch.episodes if not ep.failed)
        assert all("injected crash" in ep.failure for ep in batch.episodes if ep.failed)


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.step


@pytest.mark.parametrize("lag", [1, 2])
def test_a_resumed_run_matches_the_uninterrupted_one(lag, tiny_chatml_model, tmp_path):
    def train(output_dir, stop_at=None, resume=None):
        trainer = run(tiny_chatml_model, output_dir, lag=lag, max_steps=4, save_strategy="steps", save_steps=2,
                      callbacks=[StopAt(stop_at)] if stop_at else (), resume=resume)
        return (logged(trainer, "episodes/mean_return"), logged(trainer, "policy_lag/max"),
                [p.detach().clone() for p in trainer.model.parameters()])

    returns, lags, params = train(tmp_path / "whole")
    train(tmp_path / "cut", stop_at=2)
    assert (tmp_path / "cut" / "checkpoint-2" / POLICY_LAG_FILE).is_file()
    resumed_returns, resumed_lags, resumed_params = train(tmp_path / "cut", resume=str(tmp_path / "cut" /
                                                                                       "checkpoint-2"))
    assert len(set(returns.values())) > 1  # the returns vary with the sampled replies
    assert {s: resumed_returns[s] for s in (3, 4)} == {s: returns[s] for s in (3, 4)}
    assert {s: resumed_lags[s] for s in (3, 4)} == {s: lags[s] for s in (3, 4)}
    assert all(torch.equal(a, b) for a, b in zip(params, resumed_params))


@pytest.mark.parametrize("overrides", [
    {"rollout_overlap": True},
    {"rollout_schedule": "episode"},
    {"episode_format": "stepwise"},
    {"cache_episode_history": False},
    {"repetition_penalty": 1.1},
    {"loss_type": "vespo"},
    {"steps_per_generation": 2},  # one generation batch over 2 optimizer steps: lag 2 > 1
])
def test_unsupported_combinations_are_refused_at_config_build(overrides, tmp_path):
    name = next(iter(overrides))
    with pytest.raises(ValueError, match=f"max_policy_lag=1.*{name}"):
        tiny_rl_args(MultiTurnGRPOConfig, tmp_path, max_policy_lag=1, **overrides)
    tiny_rl_args(MultiTurnGRPOConfig, tmp_path, max_policy_lag=0, **overrides)  # on-policy: accepted


def test_a_generation_batch_over_k_steps_fits_a_lag_of_k(tmp_path):
    tiny_rl_args(MultiTurnGRPOConfig, tmp_path, max_policy_lag=2, steps_per_generation=2)


@pytest.mark.parametrize("config_cls, extra", [(MultiTurnRLOOConfig, {}),
                                               (MultiTurnPPOConfig, {"num_generations": 1})])
def test_trainers_without_the_correction_refuse_it(config_cls, extra, tmp_path):
    with pytest.raises(ValueError, match=f"max_policy_lag=1 is not supported by {config_cls.__name__}"):
        tiny_rl_args(config_cls, tmp_path, max_policy_lag=1, **extra)


def test_a_negative_lag_is_refused(tmp_path):
    with pytest.raises(ValueError, match="max_policy_lag"):
        tiny_rl_args(MultiTurnGRPOConfig, tmp_path, max_policy_lag=-1)
