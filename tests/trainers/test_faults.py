"""Faults through real trainer steps: a broken environment fails its own episode, counted in `episodes/failed`;
nothing non-finite reaches the advantages or the parameters; an oversized first observation never reaches the
model; the trainer releases its workers."""

import math

import pytest
import torch
from conftest import tiny_rl_args
from datasets import Dataset
from processes import alive
from toy_envs import CountingEnv, HugeObservationEnv
from transformers import TrainerCallback

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer, MultiTurnRLOOConfig, MultiTurnRLOOTrainer
from trl_multiturn.testing import FaultyEnv

WHOLE_REPLY = "trl_multiturn.rollout.parsing:whole_reply"


def make_trainer(model, tmp_path, rows, trainer_cls=MultiTurnGRPOTrainer, config_cls=MultiTurnGRPOConfig,
                 env_factory=FaultyEnv, reward_funcs=None, **overrides):
    overrides.setdefault("action_parser", WHOLE_REPLY)
    overrides.setdefault("reward_mode", "dense")
    args = tiny_rl_args(config_cls, tmp_path, **overrides)
    return trainer_cls(model=model, args=args, environment_factory=env_factory,
                       train_dataset=Dataset.from_list(list(rows)), reward_funcs=reward_funcs)


def finite_parameters(model) -> bool:
    return all(torch.isfinite(p).all() for p in model.parameters())


def train_logs(trainer):
    return [log for log in trainer.state.log_history if "episodes/failed" in log]


@pytest.mark.parametrize("trainer_cls,config_cls", [(MultiTurnGRPOTrainer, MultiTurnGRPOConfig),
                                                    (MultiTurnRLOOTrainer, MultiTurnRLOOConfig)])
def test_contract_breaking_results_fail_their_episode_and_parameters_stay_finite(
        tiny_chatml_model, tmp_path, trainer_cls, config_cls):
    """A NaN reward, a None reward and a non-string observation each fail their episode (counted in
    `episodes/failed`, named in its failure); the run goes on and every parameter stays finite."""
    rows = [{"fault": "nan_reward"}, {}, {"fault": "none_reward"}, {"fault": "bad_observation"}]
    trainer = make_trainer(tiny_chatml_model, tmp_path, rows, trainer_cls, config_cls, per_device_train_batch_size=8,
                           num_generations=2, max_steps=1)  # one step plays each row twice
    result = trainer.train()
    assert finite_parameters(trainer.model) and math.isfinite(result.training_loss)
    assert [log["episodes/failed"] for log in train_logs(trainer)] == [6.0]
    failures = [ep.failure for ep in trainer.last_rollout.episodes if ep.failed]
    for reason in ("reward is nan", "reward is NoneType", "observation is dict"):
        assert sum(reason in f for f in failures) == 2, (reason, failures)


def test_reward_funcs_none_nan_or_inf_add_nothing_and_advantages_stay_finite(tiny_chatml_model, tmp_path):
    """TRL turns a reward function's None into NaN (its "does not score this episode"); NaN and +-inf add nothing to
    the episode's return, whose advantages are those of the same scores with 0 in their place: finite, and the
    finite rewards of the group still move them (an infinite value read as +-3.4e38 would overflow the group's
    std)."""
    def odd(completions, **kwargs):
        return [None, float("nan"), float("inf"), 2.0, -float("inf"), 0.0, 2.0, 0.0]

    def run(reward_funcs):
        trainer = make_trainer(tiny_chatml_model, tmp_path, [{"target": 1}] * 8, env_factory=CountingEnv,
                               reward_funcs=reward_funcs, per_device_train_batch_size=8, num_generations=4)
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
        torch.manual_seed(0)
        return trainer._generate_and_score_completions([{"target": 1}] * 8)["advantages"]

    def as_zeros(completions, **kwargs):
        return [0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 2.0, 0.0]

    as_zeros.__name__ = odd.__name__
    advantages = run(odd)
    assert torch.isfinite(advantages).all()
    assert torch.equal(advantages, run(as_zeros))
    assert advantages[3].abs().sum() > 0 and advantages[6].abs().sum() > 0  # the finite rewards still count


def test_a_first_observation_over_the_episode_budget_fails_its_episode_and_never_reaches_the_model(
        tiny_chatml_model, tmp_path):
    """An episode whose first observation leaves no room for a reply fails, and its prompt never goes through a
    forward pass."""
    trainer = make_trainer(tiny_chatml_model, tmp_path, [{"fault": "huge_observation"}, {}, {}, {}],
                           per_device_train_batch_size=8, max_steps=1, max_episode_tokens=120)  # each row twice
    longest = []
    trainer.model.register_forward_pre_hook(lambda module, args, kwargs: longest.append(
        kwargs["input_ids"].shape[1] if kwargs.get("input_ids") is not None else 0), with_kwargs=True)
    result = trainer.train()
    assert math.isfinite(result.training_loss) and finite_parameters(trainer.model)
    assert train_logs(trainer)[0]["episodes/failed"] == 2.0
    failed = [ep for ep in trainer.last_rollout.episodes if ep.failed]
    assert len(failed) == 2 and "leaving no room for a reply within max_episode_tokens=120" in failed[0].failure
    # every forward holds at most a padded chunk's tokens, 8 rows of at most 120 (packed rows lie side by side in
    # one sequence): the failed episode's prompt of over 1000 tokens never went through one
    assert len(failed[0].prompt_ids) > 1000 and max(longest) <= 8 * 120


def test_a_huge_later_observation_truncates_its_episode_under_the_default_settings(tiny_chatml_model, tmp_path):
    """Under the default max_episode_tokens=None, a 1 MB observation ends its episode as truncated, with the reason,
    by `max_observation_tokens` (default 8192): it never goes whole into a forward pass (234 GB asked for)."""
    rows = [{"target": 3, "huge_bytes": 2**20}, {"target": 3}]
    trainer = make_trainer(tiny_chatml_model, tmp_path, rows, env_factory=HugeObservationEnv, max_steps=1,
                           per_device_train_batch_size=4)  # each row twice
    assert trainer.args.max_episode_tokens is None and trainer.args.max_observation_tokens == 8192

    def refuse_long_inputs(module, args, kwargs):
        ids = kwargs.get("input_ids")
        assert ids is None or ids.shape[1] < 10_000, f"a forward pass over {ids.shape[1]} tokens"

    trainer.model.register_forward_pre_hook(refuse_long_inputs, with_kwargs=True)
    result = trainer.train()
    assert math.isfinite(result.training_loss) and train_logs(trainer)[0]["episodes/failed"] == 0
    huge = [ep for ep in trainer.last_rollout.episodes if ep.task.get("huge_bytes")]
    assert len(huge) == 2 and all(ep.truncated and ep.num_turns == 1 for ep in huge)
    assert all("exceeds max_observation_tokens=8192" in ep.infos[-1]["truncation"] for ep in huge)
    assert all(ep.num_turns == 3 and ep.won for ep in trainer.last_rollout.episodes if not ep.task.get("huge_bytes"))


def test_the_trainer_releases_its_workers_and_starts_them_again(tiny_chatml_model, tmp_path):
    rows = [{"target": 1}] * 4
    trainer = make_trainer(tiny_chatml_model, tmp_path, rows, max_steps=1, per_device_train_batch_size=4,
                           per_device_eval_batch_size=4, env_mode="process")
    pool = trainer.episode_runner.pool
    seen = []

    class RecordWorkers(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.extend(pool.worker_pids())

    trainer.add_callback(RecordWorkers())
    trainer.train()
    assert len(seen) == 4 and pool.worker_pids() == []  # train() released them...
    assert not any(alive(pid) for pid in seen)  # ...and they are gone
    metrics = trainer.evaluate(eval_dataset=Dataset.from_list(rows))  # evaluation after training starts them again
    assert metrics["eval_episodes/failed"] == 0 and len(pool.worker_pids()) == 4
    pids = pool.worker_pids()
    with trainer:
        pass
    assert pool.worker_pids() == [] and not any(alive(pid) for pid in pids)
