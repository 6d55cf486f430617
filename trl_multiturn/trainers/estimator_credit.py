"""The estimator credit of GRPO and RLOO: per-turn rewards -> the configured advantage estimator's per-turn
advantages -> each turn's sampled tokens (`EstimatorCredit`), and the helpers every credit shares."""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING

import torch
from accelerate.utils import gather_object

from ..credit import CreditBatch, get_estimator, turn_to_token_advantages

if TYPE_CHECKING:
    from .batch import RolloutBatch
    from .step_log import StepLog
    from .step_tensors import StepTensors

logger = logging.getLogger(__name__)


class EstimatorCredit:
    """Credit from a registered advantage estimator (GRPO, RLOO): per-turn rewards -> per-turn advantages -> each
    turn's sampled tokens.

    The per-turn rewards of every rank's episodes (`batch.turn_rewards`: the environment's under `reward_mode`,
    weighted by `reward_weights[0]`) are gathered (a task's group may span ranks), the weighted trajectory-level
    `reward_funcs` (columns 1.. of the batch's scores) are added to each episode's final turn, and the estimator
    turns them into per-turn advantages A[i, k], broadcast to turn k's sampled tokens (step-wise: a step row takes
    its turn's).

    `options`: the estimator's keyword arguments that the trainer's config sets (gamma, scale) before
    `estimator_kwargs`; `kl_in_reward`: beta of a KL penalty subtracted from each turn's reward, beta * sum over the
    turn's sampled tokens of (log pi_old - log pi_ref) (RLOO's; 0: none); `normalize`: the advantages normalised to
    mean 0 and std 1 over every valid turn of the generation batch (RLOO's `normalize_advantages`); `reference`:
    whether the loss needs pi_ref (a KL term, `beta != 0`); `log`: the step's log (credit metrics, the KL).
    """

    def __init__(self, estimator: str, estimator_kwargs: dict | None, options: dict, kl_in_reward: float = 0.0,
                 normalize: bool = False, *, reference: bool, log: StepLog):
        self.name, self.estimator = estimator, get_estimator(estimator)
        accepted = inspect.signature(self.estimator).parameters
        self.options = {**{k: v for k, v in options.items() if k in accepted}, **(estimator_kwargs or {})}
        self.kl_in_reward, self.normalize = kl_in_reward, normalize
        self.reference, self.log = reference, log

    def needs_old_logps(self) -> bool:
        return self.kl_in_reward != 0.0

    def needs_reference(self) -> bool:
        return self.reference

    def __call__(self, batch: RolloutBatch, x: StepTensors, old, ref,
                 token_rewards: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        """(B, T) advantages; `token_rewards` (B, T), per-token rewards of another source (a distillation teacher's),
        join each turn's reward as their sum over the turn's tokens, before the estimator."""
        penalties = None
        if self.kl_in_reward and ref is not None:
            penalties = turn_kl_penalties(batch, old, ref, x.trained, self.kl_in_reward)
            self.log.masked_mean(batch.mode, "kl", old - ref, x.trained)
        if token_rewards is not None:  # a reward is a negative penalty
            taught = [[-r for r in turns] for turns in batch.layout.turn_sums(batch, token_rewards)]
            penalties = taught if penalties is None else [[p + t for p, t in zip(ps, ts)]
                                                          for ps, ts in zip(penalties, taught)]
        advantages = self.token_advantages(batch, x.length, penalties)
        return advantages.to(x.completion_ids.device), {}

    def token_advantages(self, batch: RolloutBatch, length: int,
                         turn_penalties: list[list[float]] | None = None) -> torch.Tensor:
        """(rows, length) per-token advantages of this rank's rows; `turn_penalties` (per local episode, per turn)
        are subtracted from the turn rewards first."""
        rewards = batch.turn_rewards
        if turn_penalties is not None:
            rewards = [[r - p for r, p in zip(rs, ps)] for rs, ps in zip(rewards, turn_penalties)]
        local = [(r, not ep.failed, ep.turn_states) for r, ep in zip(rewards, batch.episodes)]
        everyone = gather_object(local)
        turn_rewards = with_trajectory_rewards([list(r) for r, _, _ in everyone], batch.rewards_per_func,
                                               batch.reward_weights, self.log.reward_names)
        credit = CreditBatch.from_lists(
            turn_rewards, group_ids=[i // batch.num_generations for i in range(len(everyone))],
            valid=[v for _, v, _ in everyone], observations=[o for _, _, o in everyone])
        turn_adv = self.turn_advantages(credit)
        log_credit_metrics(self.log.metrics[batch.mode], credit, turn_adv)
        start = batch.process_index * len(local)
        local_adv = batch.layout.row_turn_advantages(batch, turn_adv[start: start + len(local)])
        return turn_to_token_advantages(local_adv, batch.row_turn_spans(), length)

    def turn_advantages(self, credit: CreditBatch) -> torch.Tensor:
        """The estimator's (N, K) advantages; with `normalize`, normalised over the valid turns."""
        advantages = self.estimator(credit, **self.options)
        turns = credit.turn_mask & credit.valid.unsqueeze(1)
        if not self.normalize or turns.sum() < 2:
            return advantages
        mean, std = advantages[turns].mean(), advantages[turns].std()
        return torch.where(turns, (advantages - mean) / (std + 1e-4), torch.zeros_like(advantages))


def turn_kl_penalties(batch: RolloutBatch, old_logps, ref_logps, trained, beta: float) -> list[list[float]]:
    """Per local episode and turn: beta * sum over the turn's sampled tokens of (log pi_old - log pi_ref), TRL RLOO's
    first-order KL estimate, restricted to the tokens the model sampled. Step-wise, each row is one turn's reply; a
    turn that `steps_per_batch` left out of the rows has no penalty."""
    per_turn = batch.layout.turn_sums(batch, (old_logps - ref_logps) * trained)
    return [[beta * kl for kl in turns] for turns in per_turn]


def with_trajectory_rewards(turn_rewards: list[list[float]], scores: torch.Tensor | None, weights: torch.Tensor,
                            names: list[str]) -> list[list[float]]:
    """Add the weighted trajectory-level `reward_funcs` (columns 1.. of `scores`, row-aligned with `turn_rewards`,
    weighted by `weights[1:]`) to each episode's final turn, in place; returns `turn_rewards`.

    A reward function's None (NaN) is TRL's "this function does not score this episode": it adds nothing, as in
    TRL's own sum over functions. An infinite value adds nothing either (it is no reward; one would turn every
    advantage of its group non-finite) and is reported in a warning naming the function."""
    if scores is not None and scores.shape[1] > 1:
        func_rewards = scores[:, 1:]
        infinite = torch.isinf(func_rewards).sum(dim=0).tolist()
        for name, count in zip(names[1:], infinite):
            if count:
                logger.warning("reward function %r returned an infinite reward for %d episode(s); counted as no "
                               "reward from it", name, count)
        finite = torch.nan_to_num(func_rewards, nan=0.0, posinf=0.0, neginf=0.0)
        extra = (finite * weights[1:].to(scores.device)).sum(dim=1).tolist()
        for r, e in zip(turn_rewards, extra):
            if r:
                r[-1] += e
    return turn_rewards


def log_credit_metrics(metrics: dict, batch: CreditBatch, turn_adv: torch.Tensor) -> None:
    """`credit/advantage_mean`/`std` over the valid turns, `credit/reward_turn_<k>`, and the fraction of task
    groups whose every advantage is 0 (`credit/zero_advantage_groups`: no learning signal)."""
    mask = batch.turn_mask & batch.valid.unsqueeze(1)
    if mask.any():
        adv = turn_adv[mask]
        metrics["credit/advantage_mean"].append(adv.mean().item())
        metrics["credit/advantage_std"].append(adv.std().item() if adv.numel() > 1 else 0.0)
    for k in range(batch.rewards.shape[1]):
        if mask[:, k].any():
            metrics[f"credit/reward_turn_{k}"].append(batch.rewards[mask[:, k], k].mean().item())
    groups = torch.unique(batch.group_ids[batch.valid])
    zero = sum(bool((turn_adv[(batch.group_ids == g) & batch.valid] == 0).all()) for g in groups)
    metrics["credit/zero_advantage_groups"].append(zero / max(1, len(groups)))
