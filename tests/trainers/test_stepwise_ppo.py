"""MultiTurnPPOTrainer with episode_format='stepwise': the critic values each step's own context, GAE runs across
the steps of an episode (those `steps_per_batch` leaves out included), and a training step moves policy and critic."""

import random

import pytest
import torch
from conftest import tiny_rl_args
from datasets import Dataset
from toy_envs import CountingEnv

from trl_multiturn import MultiTurnPPOConfig, MultiTurnPPOTrainer
from trl_multiturn.credit.gae import get_value_estimator, stepwise_value_targets
from trl_multiturn.trainers.value_model import token_values


def lose_on_odd_length(reply: str) -> str:
    """Episodes diverge: an odd-length reply loses the game."""
    return "lose" if len(reply) % 2 else "go"


def hand_targets(estimator, episodes, rewards, values, masks, gamma, lam):
    """The reference: per step (advantages, returns, value_mask) by a plain backward loop over each episode's
    steps, every episode ending after its last step."""
    out = [None] * len(episodes)
    for episode in dict.fromkeys(episodes):
        steps = [j for j, e in enumerate(episodes) if e == episode]
        if estimator == "gae":  # every trained reply token is a step
            tokens = [(j, t) for j in steps for t in range(len(rewards[j])) if masks[j][t]]
            adv = {}
            next_value = next_adv = 0.0
            for j, t in reversed(tokens):
                delta = rewards[j][t] + gamma * next_value - values[j][t]
                adv[j, t] = next_adv = delta + gamma * lam * next_adv
                next_value = values[j][t]
            for j in steps:
                a = [adv.get((j, t), 0.0) for t in range(len(rewards[j]))]
                r = [a[t] + values[j][t] if masks[j][t] else 0.0 for t in range(len(a))]
                out[j] = (a, r, list(masks[j]))
        else:  # turn_gae: delta_k = r_k + gamma * V(s_{k+1}) * (1 - done_k) - V(s_k), V(s_k) at the first token
            trained = [j for j in steps if masks[j][0]]
            next_value = next_adv = 0.0
            for j in steps:
                out[j] = ([0.0] * len(rewards[j]), [0.0] * len(rewards[j]), [False] * len(rewards[j]))
            for position, j in reversed(list(enumerate(trained))):
                done = position == len(trained) - 1
                delta = sum(rewards[j]) + gamma * next_value * (1 - done) - values[j][0]
                next_adv = delta + gamma * lam * next_adv * (1 - done)
                next_value = values[j][0]
                n = len(rewards[j])
                out[j] = ([next_adv] * n, [next_adv + values[j][0]] + [0.0] * (n - 1), [True] + [False] * (n - 1))
    return out


def assert_targets_match(got, expected):
    for step_targets, (adv, ret, value_mask) in zip(got, expected, strict=True):
        assert step_targets.advantages.tolist() == pytest.approx(adv, abs=1e-5)
        assert torch.where(step_targets.value_mask, step_targets.returns, 0.0).tolist() == pytest.approx(ret, abs=1e-5)
        assert step_targets.value_mask.tolist() == value_mask


@pytest.mark.parametrize("estimator", ["gae", "turn_gae"])
def test_targets_run_across_the_steps_of_each_episode_as_a_hand_loop_computes_them(estimator):
    rng = random.Random(0)
    # episode 0: 4 steps (done), episode 1: 1 step, episode 2: 3 steps cut by a cap (it ends there too),
    # episode 3: 2 steps masked out (mask_truncated_completions): no targets at all.
    counts, trained = [4, 1, 3, 2], [1, 1, 1, 0]
    episodes = [e for e, n in enumerate(counts) for _ in range(n)]
    lengths = [rng.randint(1, 5) for _ in episodes]
    rewards = [[0.0] * (n - 1) + [rng.uniform(-1, 2)] for n in lengths]
    rewards[1][0] = 0.7  # a reward that is not on the last token: token-level GAE keeps it where it is
    values = [[rng.uniform(-1, 1) for _ in range(n)] for n in lengths]
    masks = [[bool(trained[e])] * n for e, n in zip(episodes, lengths)]
    gamma, lam = 0.9, 0.7
    got = stepwise_value_targets(get_value_estimator(estimator), episodes,
                                 [torch.tensor(r) for r in rewards], [torch.tensor(v) for v in values],
                                 [torch.tensor(m) for m in masks], gamma=gamma, lam=lam)
    expected = hand_targets(estimator, episodes, rewards, values, masks, gamma, lam)
    assert_targets_match(got, expected)
    assert all(t.advantages.abs().sum() == 0 for t, e in zip(got, episodes) if e == 3)
    # Steps of different episodes may come interleaved: only the order within an episode matters.
    order = [0, 4, 5, 1, 8, 6, 2, 9, 7, 3]
    shuffled = stepwise_value_targets(get_value_estimator(estimator), [episodes[j] for j in order],
                                      [torch.tensor(rewards[j]) for j in order],
                                      [torch.tensor(values[j]) for j in order],
                                      [torch.tensor(masks[j]) for j in order], gamma=gamma, lam=lam)
    assert_targets_match(shuffled, [expected[j] for j in order])
    # A later step's value moves an earlier step's advantage (the recursion crosses step boundaries) ...
    moved = [torch.tensor(v) for v in values]
    moved[3] = moved[3] + 1.0
    again = stepwise_value_targets(get_value_estimator(estimator), episodes, [torch.tensor(r) for r in rewards],
                                   moved, [torch.tensor(m) for m in masks], gamma=gamma, lam=lam)
    assert again[2].advantages[0] != pytest.approx(got[2].advantages[0].item())
    # ... but never across episodes.
    assert torch.equal(again[4].advantages, got[4].advantages)
    assert stepwise_value_targets(get_value_estimator(estimator), [], [], [], []) == []  # every episode failed


def make_trainer(model, tmp_path, rows, **overrides):
    overrides.setdefault("history", "window:1")
    args = tiny_rl_args(MultiTurnPPOConfig, tmp_path, episode_format="stepwise", reward_mode="dense", max_turns=4,
                        num_generations=1, action_parser=f"{__name__}:lose_on_odd_length", **overrides)
    return MultiTurnPPOTrainer(model, args=args, environment_factory=CountingEnv,
                               train_dataset=Dataset.from_list(list(rows)))


def scored(trainer, rows):
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop, read by _compute_loss
    return trainer._generate_and_score_completions(list(rows))


@pytest.mark.parametrize("estimator", ["gae", "turn_gae"])
def test_each_step_rows_value_targets_come_from_its_episodes_steps_left_out_ones_included(tiny_chatml_model,
                                                                                        tmp_path, estimator):
    rows = [{"target": 4}, {"target": 3}, {"target": 4}, {"target": 2}]
    trainer = make_trainer(tiny_chatml_model, tmp_path, rows, advantage_estimator=estimator, kl_coef=0.0,
                           gamma=0.9, lam=0.8, steps_per_batch=4, whiten_advantages=False)
    critic = trainer.unwrapped_critic
    torch.manual_seed(0)
    with torch.no_grad():
        critic.score.weight.normal_(std=0.5)  # a head at zero values every state at 0: the test would be weak
    inputs = scored(trainer, rows)
    batch = trainer.last_rollout
    steps = batch.step_samples()
    kept = {(s.episode, s.turn): row for row, s in enumerate(batch.steps) if s is not None}
    assert len(steps) > len(kept) == 4, "steps_per_batch left no step out: the test would be weak"
    # The recorded values: a row's old_values, or for a left-out step the critic on its own context and reply.
    values = []
    for s in steps:
        n = len(s.completion_ids)
        if (s.episode, s.turn) in kept:
            values.append(inputs["old_values"][kept[s.episode, s.turn], :n].tolist())
        else:
            ids = torch.tensor([s.prompt_ids + s.completion_ids])
            values.append(token_values(critic, ids, torch.ones_like(ids), n)[0].tolist())
    # A step's value at its first reply token is the critic's head at the last token of its context.
    for s, v in zip(steps, values):
        ids = torch.tensor([s.prompt_ids])
        last = critic(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, -1, 0].item()
        assert v[0] == pytest.approx(last, abs=1e-4)
    rewards = [[0.0] * (len(s.completion_ids) - 1) + [batch.turn_rewards[s.episode][s.turn]] for s in steps]
    masks = [[True] * len(s.completion_ids) for s in steps]
    expected = hand_targets(estimator, [s.episode for s in steps], rewards, values, masks, 0.9, 0.8)
    assert any(r[-1] != 0 for r in rewards) and any(abs(v) > 1e-3 for vs in values for v in vs)
    for s, (adv, ret, value_mask) in zip(steps, expected):
        row = kept.get((s.episode, s.turn))
        if row is None:
            continue
        n = len(s.completion_ids)
        assert inputs["advantages"][row, :n].tolist() == pytest.approx(adv, abs=1e-4)
        assert inputs["value_mask"][row, :n].tolist() == value_mask
        assert torch.where(inputs["value_mask"][row, :n], inputs["returns"][row, :n], 0.0).tolist() == \
            pytest.approx(ret, abs=1e-4)
        assert not inputs["value_mask"][row, n:].any() and torch.all(inputs["advantages"][row, n:] == 0)


def test_a_stepwise_ppo_step_trains_policy_and_critic(tiny_chatml_model, tmp_path):
    rows = [{"target": 2}, {"target": 3}, {"target": 4}, {"target": 2}]
    trainer = make_trainer(tiny_chatml_model, tmp_path, rows, max_steps=1, steps_per_batch=4,
                           per_device_train_batch_size=2, steps_per_generation=2)
    assert trainer.ref_model is not None  # kl_coef=0.05: the KL is folded into each trained step's reward
    policy = {k: v.clone() for k, v in trainer.model.policy.state_dict().items()}
    critic = {k: v.clone() for k, v in trainer.unwrapped_critic.state_dict().items()}
    trainer.train()
    assert trainer.state.global_step == 1
    assert any(not torch.equal(policy[k], v) for k, v in trainer.model.policy.state_dict().items())
    assert any(not torch.equal(critic[k], v) for k, v in trainer.unwrapped_critic.state_dict().items())
    logged = next(log for log in trainer.state.log_history if "critic/value_loss" in log)
    assert logged["critic/value_loss"] > 0 and "kl_in_reward" in logged
    assert sum(s is not None for s in trainer.last_rollout.steps) <= 4
    metrics = trainer.evaluate(Dataset.from_list(rows))
    assert metrics["eval_episodes/failed"] == 0 and "eval_critic/value_mean" in metrics
