"""One episode, one weight: an episode that becomes k rows (step-wise, or an agent that rewrote its history) counts
once in a loss that averages each row first (`count_episodes_once`, `importance.episode_row_weights`), and once in
its group's baseline, as its single row does in the trajectory format."""

from collections import defaultdict

import pytest
import torch
from conftest import tiny_rl_args
from datasets import Dataset
from toy_envs import CountingEnv

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer, MultiTurnRLOOConfig, MultiTurnRLOOTrainer
from trl_multiturn.agents import AgentEnvironment
from trl_multiturn.trainers.importance import episode_row_weights, row_mean_loss


def test_episode_row_weights_by_hand():
    # rows: three steps of episode "a", one of "b", then a padding row (it trains nothing)
    trained = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1], [0, 0]])
    weights = episode_row_weights(["a", "a", "a", "b", "a"], trained)[:, 0]
    # R = 4 trained rows, E = 2 episodes: c = 4 / (2 * 3) for a's rows, 4 / (2 * 1) for b's, 1 for the padding
    assert weights.tolist() == pytest.approx([2 / 3, 2 / 3, 2 / 3, 2.0, 1.0])
    assert weights[:3].sum() == pytest.approx(weights[3].item())  # each episode weighs the same
    assert weights[:4].mean() == pytest.approx(1.0)  # the loss keeps its scale
    trajectory = episode_row_weights(["a", "b", "c"], torch.ones(3, 2))
    assert trajectory[:, 0].tolist() == [1.0, 1.0, 1.0]  # one row per episode: nothing changes


@pytest.mark.parametrize("config, rows_count_equally", [
    ({"loss_type": "grpo"}, True), ({"loss_type": "sapo"}, True),
    ({"loss_type": "dapo"}, False), ({"loss_type": "bnpo"}, False), ({"loss_type": "dr_grpo"}, False),
    ({"loss_type": "cispo"}, False), ({"loss_type": "luspo"}, False),
    ({"loss_granularity": "episode"}, True), ({"loss_granularity": "turn"}, False),
])
def test_which_losses_average_each_row_first(config, rows_count_equally):
    assert row_mean_loss(type("Config", (), config)()) is rows_count_equally


def per_episode_loss_weights(inputs, row_episodes) -> dict:
    """Each episode's total weight in a loss that averages each row first, at ratio 1 (TRL's loss_type='grpo',
    L = -1/R sum_r mean_t A[r, t]; RLOO's segment mean, one segment per step row): the sum of its rows' mean
    advantages (every turn's advantage is 1 here, so that is all the weighting)."""
    mask = (inputs["completion_mask"] * inputs["tool_mask"]).float()
    row_means = (inputs["advantages"] * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    totals = defaultdict(float)
    for row, episode in enumerate(row_episodes):
        if mask[row].any():
            totals[episode] += row_means[row].item()
    return totals


def ones_estimator(batch, **options):
    """A stand-in advantage estimator (named as such): 1 for every turn, so the advantages the step hands the loss
    are the row weights alone."""
    return batch.turn_mask.float()


def scored_episode_weights(trainer, rows, count_once: bool) -> tuple[dict, list[int]]:
    trainer.args.count_episodes_once = count_once
    trainer.step.credit.estimator = ones_estimator
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(0)
    inputs = trainer._generate_and_score_completions(list(rows))
    batch = trainer.last_rollout
    episodes = [s.episode if s is not None else -1 for s in batch.steps]
    weights = per_episode_loss_weights(inputs, episodes)
    return weights, [batch.episodes[e].num_turns for e in sorted(weights)]


@pytest.mark.parametrize("config_cls, trainer_cls, loss", [
    (MultiTurnGRPOConfig, MultiTurnGRPOTrainer, {"loss_type": "grpo"}),
    (MultiTurnRLOOConfig, MultiTurnRLOOTrainer, {}),  # its default loss_granularity='episode': one ratio per row
])
def test_a_stepwise_episode_counts_once_in_a_row_mean_loss(tiny_chatml_model, tmp_path, config_cls, trainer_cls,
                                                           loss):
    rows = [{"target": 1}] * 2 + [{"target": 3}] * 2
    args = tiny_rl_args(config_cls, tmp_path, episode_format="stepwise", history="window:1", reward_mode="dense",
                        max_turns=3, per_device_train_batch_size=4, num_generations=2, max_completion_length=4,
                        **loss)
    assert args.count_episodes_once  # the default
    trainer = trainer_cls(model=tiny_chatml_model, args=args, environment_factory=CountingEnv,
                          train_dataset=Dataset.from_list(rows))
    weights, turns = scored_episode_weights(trainer, rows, count_once=True)
    assert sorted(turns) == [1, 1, 3, 3]  # episodes of one and of three rows
    assert len(weights) == 4 and max(weights.values()) == pytest.approx(min(weights.values()), rel=1e-5)
    # TRL's own weighting (every row once): a three-step episode weighs three times a one-step one
    weights, turns = scored_episode_weights(trainer, rows, count_once=False)
    assert {k: round(w, 5) for k, w in zip(turns, [weights[e] for e in sorted(weights)])} == {1: 1.0, 3: 3.0}


def rewriting_agent(task, session):
    """An agent that replaces its history with a summary before each call (so its calls become step samples of one
    episode), making `task["calls"]` calls."""
    client = session.openai()
    messages = [{"role": "user", "content": task["goal"]}]
    for k in range(task["calls"]):
        reply = client.chat.completions.create(model=session.model, messages=messages, max_tokens=3)
        messages = [{"role": "user", "content": f"{task['goal']} So far {k + 1} replies, the last "
                                                f"{len(reply.choices[0].message.content)} characters long."}]
    return 1.0


def test_an_agent_that_rewrites_its_history_counts_once_in_a_row_mean_loss(tiny_chatml_model, tmp_path):
    rows = [{"goal": "Summarise.", "calls": 1}] * 2 + [{"goal": "Summarise again.", "calls": 3}] * 2
    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, reward_mode="dense", max_turns=3, loss_type="grpo",
                        per_device_train_batch_size=4, num_generations=2, max_completion_length=3)
    trainer = MultiTurnGRPOTrainer(model=tiny_chatml_model, args=args,
                                   environment_factory=AgentEnvironment(rewriting_agent),
                                   train_dataset=Dataset.from_list(rows))
    weights, turns = scored_episode_weights(trainer, rows, count_once=True)
    assert trainer.last_rollout.layout.name == "stepwise"  # the rewritten history made the calls step samples
    assert sorted(turns) == [1, 1, 3, 3]
    assert max(weights.values()) == pytest.approx(min(weights.values()), rel=1e-5)
    weights, turns = scored_episode_weights(trainer, rows, count_once=False)
    assert {k: round(w, 5) for k, w in zip(turns, [weights[e] for e in sorted(weights)])} == {1: 1.0, 3: 3.0}


def test_the_group_baseline_counts_each_episode_once_however_many_rows_it_becomes(tiny_chatml_model, tmp_path):
    # GRPO's baseline is the group's mean return over episodes: with returns 1 (one turn) and 1+2+3 (three turns) in
    # one group the advantages are -2.5 and +2.5 on every row of each episode, not a mean over the four rows
    rows = [{"target": 1}, {"target": 3}]
    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, episode_format="stepwise", history="window:1",
                        reward_mode="dense", max_turns=3, scale_rewards="none", per_device_train_batch_size=2,
                        num_generations=2, max_completion_length=4)
    trainer = MultiTurnGRPOTrainer(model=tiny_chatml_model, args=args, environment_factory=CountingEnv,
                                   train_dataset=Dataset.from_list(rows))
    trainer.model.train()
    torch.manual_seed(0)
    inputs = trainer._generate_and_score_completions(list(rows))
    batch = trainer.last_rollout
    mask = (inputs["completion_mask"] * inputs["tool_mask"]).bool()
    for row, step in enumerate(batch.steps):
        if step is not None:
            expected = -2.5 if batch.episodes[step.episode].num_turns == 1 else 2.5
            assert inputs["advantages"][row][mask[row]].tolist() == pytest.approx([expected] * int(mask[row].sum()))


def test_rloo_counts_an_episode_once_by_default(tmp_path):
    args = tiny_rl_args(MultiTurnRLOOConfig, tmp_path)
    assert args.loss_granularity == "episode" and row_mean_loss(args) and args.count_episodes_once
