"""One training step of every multi-turn trainer, from a generation batch of task rows to what the loss reads.

    rows --play--> RolloutBatch --pad--> ids and masks --forward--> old / reference log-probs
         --score--> reward sources --credit--> (B, T) advantages --> the loss's inputs

`MultiTurnStep.__call__` is that list, top to bottom, for GRPO, RLOO and PPO alike. The trainer builds the step's
parts once and hands them over; the step never sees the trainer:

- the episode source (`episode_source.EpisodeSource`): playing, policy lag, saving episodes, reward shaping and the
  trained mask;
- the forwards (`forwards.Forwards`): every log-prob and value forward, the packing plan, the reference model;
- the credit: `estimator_credit.EstimatorCredit` (GRPO, RLOO: the configured estimator on per-turn rewards) or
  `ppo_credit.CriticCredit` (PPO: per-token rewards, the critic's values, GAE);
- the scorer (`scorer.Scorer`): the reward functions with TRL's signature;
- the teacher of on-policy distillation, if any (`distillation.Distillation`): per-token rewards on the sampled tokens,
  added to the environment's reward through the credit or, alone, the advantages;
- the step's log (`step_log.StepLog`).

TRL asks for a generation batch in one place, `_generate_and_score_completions(inputs)`, and every trainer answers it
with its step; TRL then shuffles the returned tensors, splits them into micro-batches and hands each one to the
trainer's loss (`_compute_loss`: TRL's own for GRPO, the trainer's for RLOO and PPO), whose log-probs come from the
same `Forwards.logps`.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from typing import TYPE_CHECKING

import torch
from accelerate.utils import gather_object
from trl.trainer.utils import pad

from .batch import RolloutBatch
from .importance import episode_row_weights, importance_weights, row_mean_loss, turn_ids, weight_statistics
from .step_tensors import StepTensors, sampling_logps

if TYPE_CHECKING:
    from .distillation import Distillation
    from .episode_source import EpisodeSource
    from .forwards import Forwards
    from .scorer import Scorer
    from .step_log import StepLog

logger = logging.getLogger(__name__)


class EpisodesFailedError(RuntimeError):
    """Training stopped: every episode failed in `max_failed_steps` steps in a row."""


class MultiTurnStep:
    """The training step of a multi-turn trainer (see the module docstring): `step(rows) -> inputs of the loss`,
    from the parts it is handed. `args` is the trainer's config; `pad_token_id` and `eos_token_id` lay out a padding
    row; `use_vllm`: replies come from vLLM, whose sampler TRL may correct for; `distillation`: the teacher, if any."""

    def __init__(self, episodes: EpisodeSource, forwards: Forwards, credit, scorer: Scorer, log: StepLog, *, args,
                 accelerator, pad_token_id: int, eos_token_id: int, use_vllm: bool,
                 distillation: Distillation | None = None):
        self.episodes, self.forwards, self.credit, self.scorer, self.log = episodes, forwards, credit, scorer, log
        self.distillation = distillation
        self.args, self.accelerator, self.use_vllm = args, accelerator, use_vllm
        self.pad_token_id, self.eos_token_id = pad_token_id, eos_token_id
        self.failed_steps = 0  # training steps in a row whose every episode failed
        self.last_batch: RolloutBatch | None = None  # the last step's batch, for inspection only

    def __call__(self, rows: list[dict]) -> dict:
        # 1. Play one episode per row (step-wise: the batch's rows become its step samples).
        rows, batch = self.episodes(rows)
        if batch.mode == "train":
            self.check_failures(batch)
        # 2. The rows as padded tensors.
        x = self.tensors(batch)
        # 3. The log-probs the loss and the credit need, before any update.
        old = self.forwards.old(x, batch.mode) if self.needs_old_logps(batch) else None
        ref = self.forwards.reference(x, batch.mode) if self.credit.needs_reference() else None
        # 4. Every reward source's score: the environment's return, then each of `reward_funcs`.
        batch = batch.with_scores(self.scorer(rows, batch))
        # 5. Credit: per-token advantages (and, for PPO, the value targets). A teacher's per-token rewards join the
        #    other rewards there, or are the advantages alone (teacher_signal='loss').
        taught = self.distillation(batch, x, old) if self.distillation is not None else None
        if taught is not None and self.distillation.alone:
            advantages, extra = taught, {}
        else:
            advantages, extra = self.credit(batch, x, old, ref, taught)
        if getattr(self.args, "count_episodes_once", False) and row_mean_loss(self.args):  # one episode, one weight
            advantages = advantages * episode_row_weights(self.row_episodes(batch), x.trained)
        output = {"prompt_ids": x.prompt_ids, "prompt_mask": x.prompt_mask, "completion_ids": x.completion_ids,
                  "completion_mask": x.completion_mask, "tool_mask": x.trained, "advantages": advantages,
                  "num_items_in_batch": self.accelerator.gather(x.trained.sum()).sum(), **extra}
        if old is not None:
            output["old_per_token_logps"] = old
        if ref is not None:
            output["ref_per_token_logps"] = ref
        if x.sampled_logps is not None:
            output["sampling_per_token_logps"] = x.sampled_logps
        # 6. Off-policy corrections of the sampled tokens (a snapshot's rollout; vLLM's sampler against the model).
        if batch.policy_versions is not None:
            output["importance_sampling_ratio"] = self.policy_lag_weights(x, old, batch)
            output["advantages"] = output["advantages"] * output["importance_sampling_ratio"]
        elif self.use_vllm and getattr(self.args, "vllm_importance_sampling_correction", False) and old is not None \
                and x.sampled_logps is not None:
            output["importance_sampling_ratio"] = self.vllm_weights(x, old, batch)
        # 7. What happened, logged under TRL's and trl-multiturn's metric names.
        self.log.step(rows, batch, x, output["advantages"])
        self.log.episodes(batch, self.episodes.episode_return)
        self.last_batch = batch
        return output

    def check_failures(self, batch: RolloutBatch) -> None:
        """Count the training steps in a row whose every episode (on every rank) failed; at `max_failed_steps`
        raise `EpisodesFailedError` with the most common reasons. Each such step is logged as a warning."""
        failures = gather_object([ep.failure if ep.failed else None for ep in batch.episodes])
        if any(reason is None for reason in failures):
            self.failed_steps = 0
            return
        self.failed_steps += 1
        reasons = Counter((reason or "unknown").strip().splitlines()[0][:300] for reason in failures).most_common(3)
        summary = "; ".join(f"{count} x {reason}" for reason, count in reasons)
        limit = self.args.max_failed_steps
        logger.warning("every episode of this step failed (%d in a row, stopping at %d): %s", self.failed_steps,
                       limit, summary)
        if self.failed_steps >= limit:
            raise EpisodesFailedError(f"every episode failed in {self.failed_steps} training steps in a row "
                                      f"({len(failures)} episodes in the last), so nothing was trained; the reasons: "
                                      f"{summary}. Fix the environment or the task rows (check them with "
                                      "trl_multiturn.envs.check_environment), or raise max_failed_steps.")

    # -- 2. tensors ---------------------------------------------------------------------------------------------------

    def tensors(self, batch: RolloutBatch) -> StepTensors:
        """Each row's prompt ids (left-padded) and completion ids (right-padded) with their masks, the trained mask
        and the backend's sampling log-probs."""
        device, pad_id = self.accelerator.device, self.pad_token_id
        lists = batch.token_lists(pad_id, self.eos_token_id)
        multiple = getattr(self.args, "pad_to_multiple_of", None)

        def padded(values, fill, side, dtype=torch.long):
            return pad([torch.tensor(v, dtype=dtype) for v in values], padding_value=fill, padding_side=side,
                       pad_to_multiple_of=multiple).to(device)

        prompts, completions = [p for p, _, _, _ in lists], [c for _, c, _, _ in lists]
        trained = self.episodes.trained_mask(batch, [m for _, _, m, _ in lists])
        logps = sampling_logps([lp for _, _, _, lp in lists])
        return StepTensors(
            prompt_ids=padded(prompts, pad_id, "left"),
            prompt_mask=padded([[1] * len(p) for p in prompts], 0, "left"),
            completion_ids=padded(completions, pad_id, "right"),
            completion_mask=padded([[1] * len(c) for c in completions], 0, "right"),
            trained=padded(trained, 0, "right"),
            sampled_logps=None if logps is None else padded(logps, math.nan, "right", torch.float32),
        )

    # -- 3. log-probs -------------------------------------------------------------------------------------------------

    def needs_old_logps(self, batch: RolloutBatch) -> bool:
        """Whether the loss or the credit needs pi_old: the batch is trained on over more than one optimizer step
        (TRL's rule), vLLM's sampler is corrected for, a snapshot sampled it, or the credit or a distillation teacher
        needs them (a KL penalty in the reward, the teacher's reverse KL)."""
        args = self.args
        generate_every = args.steps_per_generation * args.num_iterations
        return (args.gradient_accumulation_steps % generate_every != 0
                or (self.use_vllm and getattr(args, "vllm_importance_sampling_correction", False))
                or batch.policy_versions is not None or self.credit.needs_old_logps()
                or self.distillation is not None)

    # -- 6. off-policy corrections ------------------------------------------------------------------------------------

    def policy_lag_weights(self, x: StepTensors, old: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
        """`max_policy_lag`: each sampled token's truncated importance weight min(pi_old / pi_behaviour, cap) of the
        weights this step starts from over the snapshot that sampled it (`importance_weights`, "token_truncate":
        length-neutral). Scaling the advantage by w > 0 is the weighted loss for every loss_type but VESPO
        (refused): -min(r w A, clip(r) w A) = w * -min(r A, clip(r) A); CISPO and SAPO are linear in A with its
        sign kept."""
        weights, outside = importance_weights(old, x.sampled_logps, x.trained, "token_truncate", None,
                                              self.args.policy_lag_is_cap)
        self.log_weights(batch, weights, outside, x.trained)
        return weights

    def vllm_weights(self, x: StepTensors, old: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
        """vLLM's sampler against the trained model: `importance_weights` of w = pi_old / pi_vllm over the trained
        tokens, at `vllm_importance_sampling_mode`'s level (token, turn, geometric: length-neutral; TRL's sequence)
        truncated to [clip_min, clip_max] (`*_truncate`) or set to 0 outside it (`*_mask`)."""
        args, metrics = self.args, self.log.metrics[batch.mode]
        mode = args.vllm_importance_sampling_mode
        turns = turn_ids(batch.row_turn_spans(), x.length, old.device) if mode.startswith("turn_") else None
        weights, outside = importance_weights(old, x.sampled_logps, x.trained, mode,
                                              args.vllm_importance_sampling_clip_min,
                                              args.vllm_importance_sampling_clip_max, turns)
        token_difference = (old - x.sampled_logps).abs()[x.trained.bool()]
        if token_difference.numel():
            metrics["sampling/sampling_logp_difference/mean"].append(
                self.accelerator.gather(token_difference.nanmean()).nanmean().item())
            metrics["sampling/sampling_logp_difference/max"].append(
                self.accelerator.gather(token_difference.nan_to_num(0).max()).max().item())
        self.log_weights(batch, weights, outside, x.trained)
        return weights

    def log_weights(self, batch: RolloutBatch, weights: torch.Tensor, outside: torch.Tensor,
                    trained: torch.Tensor) -> None:
        """`sampling/importance_sampling_ratio/{min,mean,max,ess}` and the fractions of trained tokens and of
        episodes whose ratio was truncated or masked, `sampling/importance_sampling_clipped/{tokens,episodes}`
        (`weight_statistics`, this process's rows)."""
        metrics = self.log.metrics[batch.mode]
        for name, value in weight_statistics(weights, outside, trained, self.row_episodes(batch)).items():
            metrics[f"sampling/{name}"].append(value)

    @staticmethod
    def row_episodes(batch: RolloutBatch) -> list[int]:
        """Each row's episode, as an id: step-wise rows (and an agent's step samples) of one episode share it."""
        return [id(ep) for ep in batch.layout.row_episodes(batch)]
