"""PPO's credit, the first half of its algorithm (the second is its loss, `ppo.MultiTurnPPOTrainer._compute_loss`):

    r_t  = each turn's reward on the last token the model sampled in that turn
           - kl_coef * (log pi_old(y_t) - log pi_ref(y_t)) on every sampled token
           + a distillation teacher's reward on every sampled token, if any (`distillation.py`)
    V_t  = the critic's value before token t (`forwards.Forwards.values`)
    A_t, R_t = a value estimator of `credit.gae` ('gae' over the sampled tokens, observation tokens skipped, or
           'turn_gae' one step per turn), run within each episode's row or, step-wise, across its steps
    A_t  <- (A_t - mean A) / std A over the batch's sampled tokens (`whiten_advantages`)

The value loss reads R_t (`returns`), V_t (`old_values`) and where the critic is trained (`value_mask`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from ..credit.gae import get_value_estimator, masked_moments, masked_whiten
from .estimator_credit import with_trajectory_rewards

if TYPE_CHECKING:
    from .batch import RolloutBatch
    from .forwards import Forwards
    from .step_log import StepLog
    from .step_tensors import StepTensors


class CriticCredit:
    """PPO's credit (see the module docstring). `args`: the `MultiTurnPPOConfig` (kl_coef, gamma, lam,
    advantage_estimator, whiten_advantages, mask_truncated_completions); `forwards` runs the critic; `beta`: TRL's KL
    loss term (it needs pi_ref too). It needs pi_old and pi_ref for the KL folded into the reward."""

    def __init__(self, args, forwards: Forwards, log: StepLog, accelerator, *, beta: float):
        self.args, self.forwards, self.log, self.accelerator, self.beta = args, forwards, log, accelerator, beta
        self.estimator = get_value_estimator(args.advantage_estimator)

    def needs_old_logps(self) -> bool:
        return self.args.kl_coef != 0.0

    def needs_reference(self) -> bool:
        return self.args.kl_coef != 0.0 or self.beta != 0.0

    def __call__(self, batch: RolloutBatch, x: StepTensors, old, ref,
                 token_rewards: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        """(B, T) advantages from the value estimator on the critic's values (whitened if configured), and the value
        targets the value loss reads (`returns`, `old_values`, `value_mask`). The batch's episode format runs the
        estimator (`formats.StepWise.value_targets`: step rows, the estimator across each episode's steps, a critic
        pass over the steps left out of the rows). `token_rewards` (B, T), per-token rewards of another source (a
        distillation teacher's), join each token's reward r_t."""
        args, mode = self.args, batch.mode
        mask = (x.completion_mask * x.trained).bool()
        length = x.length
        batch_size = self.forwards.batch_size(mode)
        rewards = self.token_rewards(batch, length, x.completion_ids.device)
        if token_rewards is not None:
            rewards = rewards + token_rewards * mask
        plan = self.forwards.plan(x.input_ids, x.attention_mask, length, batch_size)
        with torch.no_grad(), self.accelerator.autocast():
            values = self.forwards.values(x.input_ids, x.attention_mask, length, batch_size, plan) * mask
        if args.kl_coef != 0.0:
            kl = old - ref
            rewards = rewards - args.kl_coef * kl * mask
            self.log.masked_mean(mode, "kl_in_reward", kl, mask)
        targets = batch.layout.value_targets(
            batch, self.estimator, rewards, values, mask, gamma=args.gamma, lam=args.lam,
            mask_truncated=args.mask_truncated_completions,
            left_out_values=lambda steps: self.forwards.step_values(steps, batch_size))
        advantages = targets.advantages
        moments = self.global_moments(advantages, mask)
        if args.whiten_advantages:
            advantages = masked_whiten(advantages, mask, moments)
        value_mask = targets.value_mask & mask
        self.log_critic(mode, moments, values, targets.returns, value_mask)
        return advantages, {"returns": targets.returns, "old_values": values, "value_mask": value_mask}

    def turn_rewards(self, batch: RolloutBatch) -> list[list[float]]:
        """Per episode of `batch` and turn: the environment's weighted reward under `reward_mode`, trajectory
        `reward_funcs` (weighted) added on the final turn."""
        return with_trajectory_rewards([list(r) for r in batch.turn_rewards], batch.local_scores(),
                                       batch.reward_weights, self.log.reward_names)

    def token_rewards(self, batch: RolloutBatch, length: int, device) -> torch.Tensor:
        """(rows, length): each turn's reward on the last token the model sampled in that turn (step-wise: a step
        row's turn reward on its reply's last token); 0 elsewhere, for failed episodes and for padding rows."""
        row_rewards = batch.layout.row_turn_values(batch, self.turn_rewards(batch))
        rewards = torch.zeros(len(row_rewards), length, device=device)
        for i, (spans, turn_rewards) in enumerate(zip(batch.row_turn_spans(), row_rewards)):
            for (start, end), reward in zip(spans, turn_rewards):
                if end > start:
                    rewards[i, end - 1] += reward
        return rewards

    def global_moments(self, values, mask):
        """(sum, sum of squares, count) of `values` over `mask`, summed over all processes (for whitening)."""
        return self.accelerator.reduce(masked_moments(values, mask), reduction="sum")

    def log_critic(self, mode: str, advantage_moments, values, returns, value_mask) -> None:
        """The advantages' mean and std over the sampled tokens before whitening, the critic's mean value and target,
        and its explained variance over the positions it is trained on: 1 - Var(R - V) / Var(R) (1: the critic
        predicts every return; 0: no better than the mean return; below 0: worse)."""
        metrics = self.log.metrics[mode]
        total, total_sq, count = advantage_moments.tolist()
        mean = total / max(count, 1.0)
        metrics["credit/advantage_mean"].append(mean)
        metrics["credit/advantage_std"].append(math.sqrt(max(total_sq - count * mean ** 2, 0.0) / max(count - 1, 1.0)))
        value_moments = self.global_moments(values, value_mask)
        return_moments = self.global_moments(returns, value_mask)
        error_moments = self.global_moments(returns - values, value_mask)
        count = value_moments[2].clamp(min=1.0)
        metrics["critic/value_mean"].append((value_moments[0] / count).item())
        metrics["critic/return_mean"].append((return_moments[0] / count).item())

        def variance(moments):
            return moments[1] / count - (moments[0] / count) ** 2

        return_var = variance(return_moments)
        explained = 1 - variance(error_moments) / return_var if return_var > 1e-12 else torch.tensor(math.nan)
        metrics["critic/explained_variance"].append(explained.item())
