"""What every multi-turn trainer (GRPO, RLOO, PPO) trains on is what its logs, config and reward sources say:
the logged advantages are the ones the loss uses."""

import math

import pandas as pd
import pytest
import torch
from conftest import tiny_rl_args
from datasets import Dataset
from toy_envs import CountingEnv

from trl_multiturn import (
    MultiTurnGRPOConfig,
    MultiTurnGRPOTrainer,
    MultiTurnPPOConfig,
    MultiTurnPPOTrainer,
    MultiTurnRLOOConfig,
    MultiTurnRLOOTrainer,
)

WHOLE_REPLY = "trl_multiturn.rollout.parsing:whole_reply"

# Per trainer: (config, trainer, its turn-level credit settings).
TRAINERS = {
    "grpo": (MultiTurnGRPOConfig, MultiTurnGRPOTrainer, {"advantage_estimator": "turn_grpo"}),
    "rloo": (MultiTurnRLOOConfig, MultiTurnRLOOTrainer,
             {"advantage_estimator": "turn_rloo", "loss_granularity": "turn", "beta": 0.0}),
    "ppo": (MultiTurnPPOConfig, MultiTurnPPOTrainer, {"kl_coef": 0.0}),
}


def make_trainer(kind, model, tmp_path, rows, **overrides):
    config_cls, trainer_cls, credit = TRAINERS[kind]
    args = tiny_rl_args(config_cls, tmp_path, reward_mode="dense", action_parser=WHOLE_REPLY,
                        **{**credit, **overrides})
    return trainer_cls(model, args=args, environment_factory=CountingEnv, train_dataset=Dataset.from_list(rows))


def scored(trainer, rows):
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop, read by _compute_loss
    return trainer._generate_and_score_completions(list(rows))


def loss_mask(inputs):
    """The tokens the loss trains on: env_mask (RLOO) or TRL's completion_mask * tool_mask (GRPO, PPO)."""
    if "env_mask" in inputs:
        return inputs["tool_mask"].bool()
    return (inputs["completion_mask"] * inputs["tool_mask"]).bool()


@pytest.mark.parametrize("kind", sorted(TRAINERS))
def test_the_logged_advantages_are_the_ones_the_loss_uses(kind, tiny_chatml_model, tmp_path):
    # Episodes of 1 and 3 turns in each group; turn k earns k: turn-level credit gives the turns of one episode
    # different advantages.
    rows = [{"target": 1}, {"target": 3}, {"target": 1}, {"target": 3}]
    trainer = make_trainer(kind, tiny_chatml_model, tmp_path, rows, log_completions=True)
    inputs = scored(trainer, rows)
    advantages, mask = inputs["advantages"], loss_mask(inputs)
    logged = list(trainer._logs["advantages"])
    per_turn = list(trainer._logs["extra"]["turn_advantages"])
    assert logged == pytest.approx([advantages[i][mask[i]].mean().item() for i in range(4)], abs=1e-5)
    assert len(per_turn) == len(trainer._logs["prompt"]) == 4
    varied = False
    for i, ep in enumerate(trainer.last_rollout.episodes):
        expected = [advantages[i, s:e][mask[i, s:e]].mean().item() for s, e in ep.turn_spans]
        assert per_turn[i] == pytest.approx(expected, abs=1e-4)
        varied |= len(set(per_turn[i])) > 1
    assert varied  # per turn, not one trajectory value repeated

    if kind != "rloo":  # TRL's RLOO writes no parquet; GRPO's (and so PPO's) does
        trainer.log({})
        table = pd.read_parquet(tmp_path / "completions" / "completions_00000.parquet")
        assert table["advantage"].tolist() == pytest.approx(logged, abs=1e-6)
        assert [list(t) for t in table["turn_advantages"]] == per_turn


def test_an_episode_the_loss_does_not_train_on_logs_no_advantage(tiny_chatml_model, tmp_path):
    from toy_envs import FlakyEnv

    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, reward_mode="dense", action_parser=WHOLE_REPLY)
    rows = [{"target": 1, "mode": "raise"}, *[{"target": t, "mode": "ok"} for t in (1, 2, 2)]]
    trainer = MultiTurnGRPOTrainer(tiny_chatml_model, args=args, environment_factory=FlakyEnv,
                                   train_dataset=Dataset.from_list(rows))
    scored(trainer, rows)
    assert math.isnan(trainer._logs["advantages"][0]) and trainer._logs["extra"]["turn_advantages"][0] == []
    assert not math.isnan(trainer._logs["advantages"][2])
    assert torch.isfinite(torch.tensor(list(trainer._logs["advantages"])[1:])).all()


def bonus(completions, **kwargs):
    """A trajectory-level reward function: 10 for every episode."""
    return [10.0] * len(completions)


@pytest.mark.parametrize("kind", sorted(TRAINERS))
def test_reward_weights_scale_what_the_credit_is_given(kind, tiny_chatml_model, tmp_path):
    # reward_weights[0] weighs the environment's per-turn rewards, the others the trajectory reward_funcs (on the
    # final turn). Turn k earns k here, so a 3-turn episode's credit must see [0.5 * 1, 0.5 * 2, 0.5 * 3 + 2 * 10].
    config_cls, trainer_cls, credit = TRAINERS[kind]
    args = tiny_rl_args(config_cls, tmp_path, reward_mode="dense", action_parser=WHOLE_REPLY,
                        reward_weights=[0.5, 2.0], **credit)
    rows = [{"target": 3}, {"target": 2}, {"target": 3}, {"target": 2}]
    trainer = trainer_cls(tiny_chatml_model, reward_funcs=[bonus], args=args, environment_factory=CountingEnv,
                          train_dataset=Dataset.from_list(rows))
    given = []
    if kind == "ppo":
        inputs = scored(trainer, rows)  # gamma = lam = 1, no KL: the value target is the reward-to-go
        for i, ep in enumerate(trainer.last_rollout.episodes):
            given.append([inputs["returns"][i, s].item() for s, _ in ep.turn_spans])
        expected = [[0.5 * sum(range(k + 1, ep.num_turns + 1)) + 20.0 for k in range(ep.num_turns)]
                    for ep in trainer.last_rollout.episodes]
    else:
        credit = trainer.step.credit
        turn_advantages = credit.turn_advantages
        credit.turn_advantages = lambda batch: given.append(batch.rewards.clone()) or turn_advantages(batch)
        scored(trainer, rows)
        given = [given[0][i, : ep.num_turns].tolist() for i, ep in enumerate(trainer.last_rollout.episodes)]
        expected = [[0.5 * (k + 1) + 20.0 * (k == ep.num_turns - 1) for k in range(ep.num_turns)]
                    for ep in trainer.last_rollout.episodes]
    assert [ep.num_turns for ep in trainer.last_rollout.episodes] == [3, 2, 3, 2]
    assert given == [pytest.approx(e, abs=1e-4) for e in expected]


@pytest.mark.parametrize("kind", sorted(TRAINERS))
def test_mask_truncated_completions_masks_the_truncated_episodes_only(kind, tiny_chatml_model, tmp_path):
    # max_turns=3: target-9 episodes are cut (truncated); target-1 episodes end after one reply, which the random
    # model does not finish within max_completion_length: a cut reply, but not a truncated episode.
    rows = [{"target": 1}, {"target": 9}, {"target": 1}, {"target": 9}]
    trainer = make_trainer(kind, tiny_chatml_model, tmp_path, rows, mask_truncated_completions=True)
    inputs = scored(trainer, rows)
    mask = loss_mask(inputs)
    episodes = trainer.last_rollout.episodes
    assert [ep.truncated for ep in episodes] == [False, True, False, True]
    eos = set(trainer.eos_token_ids)
    assert any(ep.completion_ids[-1] not in eos for ep in episodes if not ep.truncated)  # a cut reply is kept...
    for i, ep in enumerate(episodes):
        assert mask[i].sum().item() == (0 if ep.truncated else sum(ep.env_mask)), i  # ...a truncated episode is not
        if kind == "ppo":
            assert inputs["value_mask"][i].any().item() is not ep.truncated

    trainer.args.mask_truncated_completions = False
    inputs = scored(trainer, rows)
    assert [loss_mask(inputs)[i].sum().item() for i in range(4)] == [sum(ep.env_mask)
                                                                   for ep in trainer.last_rollout.episodes]
