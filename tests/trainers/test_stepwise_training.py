"""MultiTurnGRPOTrainer with episode_format='stepwise': one TRL row per step, each with its turn's advantage from
the configured estimator (turn-level GRPO/RLOO, GiGPO's anchor-state groups, REINFORCE++'s batch normalisation), a
non-zero gradient, and the configs that cannot work refused when they are built."""

import dataclasses
import logging
import random
import statistics

import pytest
import torch
from conftest import tiny_rl_args
from datasets import Dataset
from toy_envs import CountingEnv
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_multiturn import (
    MultiTurnGRPOConfig,
    MultiTurnGRPOTrainer,
    MultiTurnRLOOConfig,
    MultiTurnRLOOTrainer,
)
from trl_multiturn.commands.train import evaluation_options
from trl_multiturn.credit import CreditBatch, get_estimator
from trl_multiturn.episode_settings import episode_settings
from trl_multiturn.evaluation import evaluate
from trl_multiturn.rollout.formats import Trajectory
from trl_multiturn.rollout.history import window
from trl_multiturn.rollout.rules import EpisodeRules
from trl_multiturn.trainers.estimator_credit import turn_kl_penalties
from trl_multiturn.trainers.rows import fit_steps


def make_trainer(model, tmp_path, rows, **overrides):
    overrides.setdefault("episode_format", "stepwise")
    overrides.setdefault("history", "window:1")
    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, reward_mode="dense", max_turns=4, **overrides)
    return MultiTurnGRPOTrainer(model=model, args=args, environment_factory=CountingEnv,
                                train_dataset=Dataset.from_list(list(rows)))


def scored(trainer, rows):
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop, read by _compute_loss
    return trainer._generate_and_score_completions(list(rows))


def assert_trains_one_step(trainer, inputs):
    """`inputs` give a non-zero gradient, and one training step changes the weights."""
    trainer.model.zero_grad()
    trainer._compute_loss(trainer.model, inputs).backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainer.model.parameters())
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert trainer.state.global_step == 1
    assert any(not torch.equal(b, a) for b, a in zip(before, trainer.model.parameters()))


def lose_on_odd_length(reply: str) -> str:
    """Episodes of one task diverge: an odd-length reply loses the game."""
    return "lose" if len(reply) % 2 else "go"


@pytest.mark.parametrize("estimator", ["turn_grpo", "turn_rloo", "gigpo", "reinforce_pp"])
def test_each_step_row_is_its_sample_with_its_turns_advantage(tiny_chatml_model, tmp_path, estimator):
    rows = [{"target": 3}] * 4 + [{"target": 2}] * 4
    trainer = make_trainer(tiny_chatml_model, tmp_path, rows, advantage_estimator=estimator, scale_rewards="none",
                           per_device_train_batch_size=8, num_generations=4,
                           action_parser=f"{__name__}:lose_on_odd_length")
    torch.manual_seed(0)
    inputs = scored(trainer, rows)
    batch = trainer.last_rollout
    steps = [s for s in batch.steps if s is not None]
    assert len(steps) == sum(ep.num_turns for ep in batch.episodes) and len(batch.steps) % 4 == 0
    assert len({ep.num_turns for ep in batch.episodes}) > 1, "episodes did not diverge: the test would be weak"
    # the reference: the estimator on the episodes' per-turn rewards, one advantage per (episode, turn)
    credit = CreditBatch.from_lists(batch.turn_rewards, [i // 4 for i in range(8)], [True] * 8,
                                    [ep.turn_states for ep in batch.episodes])
    expected = get_estimator(estimator)(credit, **({} if estimator == "turn_rloo" else {"scale": False}))
    assert expected.abs().sum() > 0
    for row, step in enumerate(batch.steps):
        n = 0 if step is None else len(step.completion_ids)
        assert inputs["completion_ids"][row, :n].tolist() == (step.completion_ids if step else [])
        if step is None:  # padding trains on nothing
            assert inputs["completion_mask"][row].mul(inputs["tool_mask"][row]).sum() == 0
            continue
        prompt = inputs["prompt_ids"][row][inputs["prompt_mask"][row].bool()].tolist()
        assert prompt == step.prompt_ids == batch.episodes[step.episode].step_contexts[step.turn]
        assert inputs["advantages"][row, :n].tolist() == pytest.approx(
            [float(expected[step.episode, step.turn])] * n, abs=1e-6)
        assert torch.all(inputs["advantages"][row, n:] == 0)


def test_a_stepwise_run_trains_with_a_nonzero_gradient(tiny_chatml_model, tmp_path):
    rows = [{"target": 2}, {"target": 2}, {"target": 4}, {"target": 4}]
    trainer = make_trainer(tiny_chatml_model, tmp_path, rows, advantage_estimator="gigpo", max_steps=1,
                           action_parser=f"{__name__}:lose_on_odd_length", steps_per_batch=8)
    torch.manual_seed(0)
    inputs = scored(trainer, rows)
    assert inputs["completion_ids"].shape[0] == 8
    assert_trains_one_step(trainer, inputs)
    metrics = trainer.evaluate(Dataset.from_list(rows))  # eval rows are step samples too, padded to whole groups
    steps = trainer.last_rollout.steps
    assert steps is not None and len(steps) % trainer.num_generations_eval == 0
    assert metrics["eval_episodes/failed"] == 0 and "eval_credit/advantage_mean" in metrics


def test_padding_rows_do_not_log_trls_no_reward_warning(tiny_chatml_model, tmp_path, caplog):
    """A padding row has no episode return; TRL would log "All reward functions returned None" with the row's
    kwargs on every such step (`trl_multiturn.quiet`)."""
    rows = [{"target": 1}, {"target": 1}]
    trainer = make_trainer(tiny_chatml_model, tmp_path, rows, steps_per_batch=4)
    with caplog.at_level(logging.WARNING):
        scored(trainer, rows)
    assert trainer.last_rollout.steps.count(None) == 2  # two one-turn episodes, padded to 4 rows
    assert not [r for r in caplog.records if "All reward functions returned None" in r.getMessage()]


def test_reinforce_pp_trains_step_wise_on_returns_to_go_normalised_over_every_step_played(tiny_chatml_model,
                                                                                          tmp_path):
    """REINFORCE++: step k of episode i trains with (G[i, k] - mean_B G) / (std_B G + eps), B every step the batch
    played (each counted once, before steps_per_batch draws its rows), so groups whose episodes all return the same,
    which a group baseline leaves with nothing to learn, still train against the batch."""
    rows = [{"target": 2}, {"target": 2}, {"target": 4}, {"target": 4}]
    trainer = make_trainer(tiny_chatml_model, tmp_path, rows, advantage_estimator="reinforce_pp", max_steps=1,
                           steps_per_batch=8)
    torch.manual_seed(0)
    inputs = scored(trainer, rows)
    batch = trainer.last_rollout
    returns = {(i, k): sum(r[k:]) for i, r in enumerate(batch.turn_rewards) for k in range(len(r))}
    assert len(returns) == sum(ep.num_turns for ep in batch.episodes) > len(batch.steps) == 8
    assert all(len({sum(batch.turn_rewards[i]) for i in (g, g + 1)}) == 1 for g in (0, 2)), "groups must tie"
    mean, std = statistics.mean(returns.values()), statistics.stdev(returns.values())
    for row, step in enumerate(batch.steps):
        n = len(step.completion_ids)
        expected = (returns[step.episode, step.turn] - mean) / (std + 1e-4)
        assert inputs["advantages"][row, :n].tolist() == pytest.approx([expected] * n, abs=1e-5)
    assert inputs["advantages"].abs().sum() > 0
    assert_trains_one_step(trainer, inputs)


WINDOWS_RENDERED = []


def recorded_window(opening, turns):
    """`window:1`, recording how many turns each context was built from."""
    WINDOWS_RENDERED.append(len(turns))
    return window(1)(opening, turns)


def always_go(reply: str) -> str:
    return "go"


def test_held_out_evaluation_plays_the_history_the_model_was_trained_with(tiny_chatml_model, tmp_path):
    policy = f"{__name__}:recorded_window"
    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, episode_format="stepwise", history=policy, max_turns=4)
    trajectory = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, max_turns=4)
    # what a training script passes to evaluate, and what every checkpoint saves for `trl-multiturn eval`
    rules = evaluation_options(args)["rules"]
    assert rules == EpisodeRules.from_dict(episode_settings(args)) and (rules.episode_format, rules.history) == (
        "stepwise", policy)
    assert isinstance(evaluation_options(trajectory)["rules"].episode_format_strategy(), Trajectory)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_chatml_model), AutoTokenizer.from_pretrained(
        tiny_chatml_model)
    rows = [{"target": 3}]
    go = f"{__name__}:always_go"
    for how in ({"rules": dataclasses.replace(rules, action_parser=go)},
                {"episode_settings": {**episode_settings(args), "action_parser": go}}):
        WINDOWS_RENDERED.clear()
        result = evaluate(model, CountingEnv, rows, tokenizer, progress=False, **how)
        assert result.success_rate == 1.0 and WINDOWS_RENDERED == [1, 2]  # turns 1 and 2 of 3, through the policy
        assert len(result.episodes[0].step_contexts) == 3
    WINDOWS_RENDERED.clear()
    result = evaluate(model, CountingEnv, rows, tokenizer, progress=False,
                      rules=dataclasses.replace(evaluation_options(trajectory)["rules"], action_parser=go))
    assert WINDOWS_RENDERED == [] and result.episodes[0].step_contexts == [] and result.success_rate == 1.0


def test_fit_steps_draws_a_subset_in_order_or_pads_to_the_budget():
    samples = list(range(10))
    drawn = fit_steps(samples, 4, 2, random.Random(0))
    assert len(drawn) == 4 and drawn == sorted(drawn) and set(drawn) <= set(samples)
    assert fit_steps(samples, 12, 2, random.Random(0)) == [*samples, None, None]
    assert fit_steps(samples, None, 4, random.Random(0)) == [*samples, None, None]
    assert fit_steps([], None, 4, random.Random(0)) == [None] * 4
    # every step is equally likely to be kept
    counts = [0] * 10
    for seed in range(2000):
        for s in fit_steps(samples, 3, 1, random.Random(seed)):
            counts[s] += 1
    assert max(counts) - min(counts) < 0.15 * 600


@pytest.mark.parametrize("config_cls, overrides, message", [
    (MultiTurnGRPOConfig, {"episode_format": "steps"}, "episode_format"),
    (MultiTurnGRPOConfig, {"history": "window:2"}, "only applies to episode_format='stepwise'"),
    (MultiTurnGRPOConfig, {"steps_per_batch": 8}, "only applies to episode_format='stepwise'"),
    (MultiTurnGRPOConfig, {"episode_format": "stepwise", "history": "window:0"}, "history='window:0'"),
    (MultiTurnGRPOConfig, {"episode_format": "stepwise", "steps_per_batch": 0}, "steps_per_batch"),
    (MultiTurnGRPOConfig, {"episode_format": "stepwise", "steps_per_batch": 3, "steps_per_generation": 2},
     "multiple of steps_per_generation"),
])
def test_configs_that_cannot_work_are_refused_when_built(tmp_path, config_cls, overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_rl_args(config_cls, tmp_path, **overrides)


def test_steps_per_batch_must_fill_whole_groups(tiny_chatml_model, tmp_path):
    with pytest.raises(ValueError, match="steps_per_batch=3 times 1 process.*num_generations=2"):
        make_trainer(tiny_chatml_model, tmp_path, [{"target": 2}] * 4, steps_per_batch=3)


def test_rloo_trains_step_wise_with_one_ratio_per_step_and_its_turns_kl_penalty(tiny_chatml_model, tmp_path):
    rows = [{"target": 2}, {"target": 2}, {"target": 4}, {"target": 4}]
    args = tiny_rl_args(MultiTurnRLOOConfig, tmp_path, reward_mode="dense", max_turns=4, max_steps=1,
                        episode_format="stepwise", history="window:1", advantage_estimator="turn_rloo",
                        action_parser=f"{__name__}:lose_on_odd_length", steps_per_batch=8, beta=0.5)
    trainer = MultiTurnRLOOTrainer(model=tiny_chatml_model, args=args, environment_factory=CountingEnv,
                                   train_dataset=Dataset.from_list(rows))
    torch.manual_seed(0)
    inputs = scored(trainer, rows)
    batch = trainer.last_rollout
    assert inputs["completion_ids"].shape[0] == len(batch.steps) == 8
    # each step row's KL penalty lands on its own episode's turn (a KL of 1 per token: beta * reply length)
    penalties = turn_kl_penalties(batch, inputs["old_per_token_logps"], inputs["old_per_token_logps"] - 1.0,
                                  inputs["tool_mask"], trainer.beta)
    for step in batch.steps:
        if step is not None:
            assert penalties[step.episode][step.turn] == pytest.approx(0.5 * len(step.completion_ids), rel=1e-5)
    trainer.model.zero_grad()
    trainer._compute_loss(trainer.model, inputs).backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainer.model.parameters())
    trainer.train()
    assert trainer.state.global_step == 1
