"""Advantage estimators: per-turn rewards of a batch of episodes -> per-turn advantages.

Every estimator is a pure function `estimator(batch: CreditBatch, **options) -> Tensor (N, K)` registered in
`ESTIMATORS` under its config name. The trainer broadcasts turn k's advantage to the tokens the model sampled in
turn k (`credit.tokens.turn_to_token_advantages`). Adding an estimator is one function and one `@register` line.

Notation: N episodes, K = the longest episode's number of turns, r[i, k] the reward of episode i at turn k
(0 past its last turn), g(i) the group of episode i (the episodes played on the same task), G_g the number of
valid (non-failed) episodes in group g. Failed episodes take no part in any baseline and get advantage 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class CreditBatch:
    """Per-turn rewards of N episodes, padded to K turns.

    rewards: (N, K) float, 0 past an episode's last turn.
    turn_mask: (N, K) bool, True on an episode's real turns.
    group_ids: (N,) long, equal for episodes of the same task group.
    valid: (N,) bool, False for failed episodes.
    observations: optional per-episode list of the observation each turn started from (for anchor-state
        estimators such as GiGPO).
    """

    rewards: torch.Tensor
    turn_mask: torch.Tensor
    group_ids: torch.Tensor
    valid: torch.Tensor
    observations: list[list[str]] | None = None

    @classmethod
    def from_lists(cls, turn_rewards: list[list[float]], group_ids: list[int], valid: list[bool],
                   observations: list[list[str]] | None = None) -> "CreditBatch":
        n, k = len(turn_rewards), max((len(r) for r in turn_rewards), default=0)
        rewards = torch.zeros(n, max(k, 1))
        mask = torch.zeros(n, max(k, 1), dtype=torch.bool)
        for i, r in enumerate(turn_rewards):
            rewards[i, : len(r)] = torch.tensor(r, dtype=torch.float32)
            mask[i, : len(r)] = True
        return cls(rewards, mask, torch.tensor(group_ids, dtype=torch.long), torch.tensor(valid, dtype=torch.bool),
                   observations)


Estimator = Callable[..., torch.Tensor]
ESTIMATORS: dict[str, Estimator] = {}


def register(name: str):
    """Register an estimator under `name` (the value of `advantage_estimator` in the configs)."""

    def wrap(fn: Estimator) -> Estimator:
        ESTIMATORS[name] = fn
        return fn

    return wrap


def get_estimator(name: str) -> Estimator:
    if name not in ESTIMATORS:
        raise ValueError(f"advantage_estimator={name!r}: choose one of {sorted(ESTIMATORS)}")
    return ESTIMATORS[name]


def discounted_returns(rewards: torch.Tensor, turn_mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Return-to-go per turn: G[i, k] = sum_{j >= k} gamma^(j - k) r[i, j] over the episode's real turns."""
    rewards = rewards * turn_mask
    out = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
    for k in range(rewards.shape[1] - 1, -1, -1):
        running = rewards[:, k] + gamma * running
        out[:, k] = running
    return out * turn_mask


def group_mean_std(values: torch.Tensor, group_ids: torch.Tensor, valid: torch.Tensor):
    """Per element: the mean and unbiased std of `values` over the valid members of its group (std 0 for a group of
    one). Invalid elements neither count nor receive statistics (NaN)."""
    mean = torch.full_like(values, float("nan"))
    std = torch.full_like(values, float("nan"))
    for g in torch.unique(group_ids):
        members = (group_ids == g) & valid
        if members.any():
            v = values[members]
            mean[members] = v.mean()
            std[members] = v.std() if v.numel() > 1 else torch.zeros(())
    return mean, std


def _broadcast_to_turns(per_episode: torch.Tensor, batch: CreditBatch) -> torch.Tensor:
    out = per_episode.unsqueeze(1) * batch.turn_mask
    return torch.where(batch.valid.unsqueeze(1), out, torch.zeros_like(out))


@register("grpo")
def grpo(batch: CreditBatch, gamma: float = 1.0, scale: bool = True, eps: float = 1e-4) -> torch.Tensor:
    """GRPO: group-normalised trajectory return, the same advantage on every turn of an episode.

        R_i = sum_k gamma^k r[i, k]
        A_i = (R_i - mean_{j in g(i)} R_j) / (std_{j in g(i)} R_j + eps)      (no division when scale=False)
    """
    returns = discounted_returns(batch.rewards, batch.turn_mask, gamma)[:, 0]
    mean, std = group_mean_std(returns, batch.group_ids, batch.valid)
    adv = returns - mean
    if scale:
        adv = adv / (std + eps)
    return _broadcast_to_turns(torch.nan_to_num(adv), batch)


@register("rloo")
def rloo(batch: CreditBatch, gamma: float = 1.0) -> torch.Tensor:
    """RLOO: the trajectory return minus the mean return of the *other* valid episodes of the group.

        A_i = R_i - 1/(G_g - 1) * sum_{j in g(i), j != i} R_j = G_g/(G_g - 1) * (R_i - mean_{g(i)} R)

    A group with a single valid episode has no baseline and gets advantage 0.
    """
    returns = discounted_returns(batch.rewards, batch.turn_mask, gamma)[:, 0]
    adv = torch.zeros_like(returns)
    for g in torch.unique(batch.group_ids):
        members = (batch.group_ids == g) & batch.valid
        size = int(members.sum())
        if size > 1:
            r = returns[members]
            adv[members] = r - (r.sum() - r) / (size - 1)
    return _broadcast_to_turns(adv, batch)
