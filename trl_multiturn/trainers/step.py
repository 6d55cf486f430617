"""One training step of every multi-turn trainer, from a generation batch of task rows to what the loss reads.

    rows --play--> RolloutBatch --pad--> ids and masks --forward--> old / reference log-probs
         --score--> reward sources --credit--> (B, T) advantages --> the loss's inputs

`MultiTurnStep.__call__` is that list, top to bottom, for GRPO, RLOO and PPO alike. TRL asks for a generation batch
in one place, `_generate_and_score_completions(inputs)`, and every trainer answers it with its step; TRL then
shuffles the returned tensors, splits them into micro-batches and hands each one to the trainer's loss
(`_compute_loss`: TRL's own for GRPO, the trainer's for RLOO and PPO). The trainers differ only in their `credit`:
`EstimatorCredit` (GRPO, RLOO: the configured estimator on per-turn rewards) or PPO's `CriticCredit` (per-token
rewards, the critic's values, GAE).

Log-probabilities come from one function, `token_logps_and_entropies`, for every forward of a step: the behaviour
log-probs of a policy snapshot, old, reference and the loss's own (the trainers route TRL's
`_get_per_token_logps_and_entropies` to it), so the ratio pi / pi_old is exactly 1 at a batch's first update
whatever the TRL release, and a packed forward can replace the padded one in a single place.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from accelerate.utils import gather, gather_object
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import nanstd, pad

from ..credit import CreditBatch, get_estimator, turn_to_token_advantages
from ..rollout.batch import RolloutBatch
from .importance import episode_row_weights, importance_weights, row_mean_loss, turn_ids, weight_statistics

logger = logging.getLogger(__name__)


def token_logps_and_entropies(logits: torch.Tensor, ids: torch.Tensor, temperature: float,
                              compute_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probability of `ids` under the softmax of `logits / temperature`, and optionally its entropy:

        log p_t = z_t[y_t] - logsumexp(z_t),    H_t = logsumexp(z_t) - sum_v softmax(z_t)_v z_t[v],
        z_t = logits_t / T - max_v logits_t[v] / T

    `logits` (B, T, V) predict `ids` (B, T); computed in float32. Both are invariant to the shift by the row's
    maximum, which keeps the entropy's two terms small: unshifted, a 32k-token row of logits with std 5 loses ~1e-4
    to their cancellation; shifted, the entropy is as exact as TRL's `entropy_from_logits` (~1e-5, against a
    float64 reference: tests/trainers/test_token_entropy.py). The shift is a constant to autograd, so the
    gradients are those of the formula above."""
    z = logits.float() / temperature
    z = z - z.detach().amax(dim=-1, keepdim=True)
    normaliser = torch.logsumexp(z, dim=-1)
    logps = z.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - normaliser
    entropies = normaliser - (torch.softmax(z, dim=-1) * z).sum(-1) if compute_entropy else None
    return logps, entropies


def sequence_logps(model, input_ids, attention_mask, logits_to_keep: int, *, temperature: float,
                   batch_size: int | None = None, compute_entropy: bool = False, compute_aux_loss: bool = False,
                   autocast=None):
    """(log-probs (B, logits_to_keep), entropies or None, aux loss or None) of the last `logits_to_keep` tokens of
    each row under `model` (rows left-padded prompt then right-padded completion, as TRL lays them out; 0 at padding),
    `batch_size` rows per forward. The model computes logits for those positions only (`logits_to_keep`)."""
    batch_size = batch_size or input_ids.size(0)
    logps, entropies, aux = [], [], []
    for start in range(0, input_ids.size(0), batch_size):
        ids, mask = input_ids[start: start + batch_size], attention_mask[start: start + batch_size]
        kwargs = {"output_router_logits": True} if compute_aux_loss else {}
        with autocast() if autocast is not None else nullcontext():
            out = model(input_ids=ids, attention_mask=mask, logits_to_keep=logits_to_keep + 1, use_cache=False,
                        **kwargs)
        lp, ent = token_logps_and_entropies(out.logits[:, -logits_to_keep - 1:-1], ids[:, -logits_to_keep:],
                                            temperature, compute_entropy)
        padding = mask[:, -logits_to_keep:] == 0  # 0 there, as TRL's own function gives
        logps.append(lp.masked_fill(padding, 0.0))
        entropies.append(ent.masked_fill(padding, 0.0) if compute_entropy else None)
        if compute_aux_loss:
            aux.append(out.aux_loss)
    return (torch.cat(logps), torch.cat(entropies) if compute_entropy else None,
            torch.stack(aux).mean() if compute_aux_loss else None)


class EpisodesFailedError(RuntimeError):
    """Training stopped: every episode failed in `max_failed_steps` steps in a row."""


def sampling_logps(rows: list[list[float | None]]) -> list[list[float]] | None:
    """The behaviour log-probs the generation backend reported per row, None (NaN) where it reported none for a
    token (vLLM reports a NaN log-prob as None); None when it reported none at all (the transformers path)."""
    if all(v is None or math.isnan(v) for row in rows for v in row):
        return None
    return [[math.nan if v is None else v for v in row] for row in rows]


@dataclass(frozen=True)
class StepTensors:
    """The padded tensors of a step's rows as TRL's losses read them: prompts left-padded, completions
    right-padded; `trained` is 1 on the sampled tokens the loss trains on (env_mask, without truncated or stale
    episodes), `sampled_logps` the behaviour log-probs the backend reported (None: it reported none)."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    trained: torch.Tensor
    sampled_logps: torch.Tensor | None

    # once per step: every forward of the step reads these rows (and a `packing.RowsPlanner` knows them by identity)
    @functools.cached_property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @functools.cached_property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)

    @property
    def length(self) -> int:
        return self.completion_ids.size(1)


class MultiTurnStep:
    """The training step of a multi-turn trainer (see the module docstring): `step(rows) -> inputs of the loss`.

    It holds the trainer (its model, accelerator, config, reward sources and metric log) and the trainer's credit.
    """

    def __init__(self, trainer, credit):
        self.trainer = trainer
        self.credit = credit
        self.failed_steps = 0  # training steps in a row whose every episode failed

    def __call__(self, rows: list[dict]) -> dict:
        t = self.trainer
        # 1. Play one episode per row (step-wise: the batch's rows become its step samples).
        rows, batch = t._rollout(rows)
        if batch.mode == "train":
            self.check_failures(batch)
        # 2. The rows as padded tensors.
        x = self.tensors(batch)
        # 3. The log-probs the loss and the credit need, before any update.
        old = self.old_logps(x, batch) if self.needs_old_logps(batch) else None
        ref = self.reference_logps(x, batch.mode) if self.credit.needs_reference(t) else None
        # 4. Every reward source's score: the environment's return, then each of `reward_funcs`.
        batch = batch.with_scores(self.score(rows, batch))
        # 5. Credit: per-token advantages (and, for PPO, the value targets).
        advantages, extra = self.credit(t, batch, x, old, ref)
        if getattr(t.args, "count_episodes_once", False) and row_mean_loss(t.args):  # one episode, one weight
            advantages = advantages * episode_row_weights(self.row_episodes(batch), x.trained)
        output = {"prompt_ids": x.prompt_ids, "prompt_mask": x.prompt_mask, "completion_ids": x.completion_ids,
                  "completion_mask": x.completion_mask, "tool_mask": x.trained, "advantages": advantages,
                  "num_items_in_batch": t.accelerator.gather(x.trained.sum()).sum(), **extra}
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
        elif t.use_vllm and getattr(t.args, "vllm_importance_sampling_correction", False) and old is not None \
                and x.sampled_logps is not None:
            output["importance_sampling_ratio"] = self.vllm_weights(x, old, batch)
        # 7. What happened, logged under TRL's and trl-multiturn's metric names.
        self.log(rows, batch, x, output["advantages"])
        t.last_rollout = batch
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
        limit = self.trainer.args.max_failed_steps
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
        t = self.trainer
        device, pad_id = t.accelerator.device, t.text_tokenizer.pad_token_id
        lists = batch.token_lists(pad_id, t.stop_token_ids[0])
        multiple = getattr(t.args, "pad_to_multiple_of", None)

        def padded(values, fill, side, dtype=torch.long):
            return pad([torch.tensor(v, dtype=dtype) for v in values], padding_value=fill, padding_side=side,
                       pad_to_multiple_of=multiple).to(device)

        prompts, completions = [p for p, _, _, _ in lists], [c for _, c, _, _ in lists]
        trained = t._trained_mask(batch, [m for _, _, m, _ in lists])
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
        (TRL's rule), vLLM's sampler is corrected for, a snapshot sampled it, or the credit needs them (a KL
        penalty in the reward)."""
        t = self.trainer
        generate_every = t.args.steps_per_generation * t.num_iterations
        return (t.args.gradient_accumulation_steps % generate_every != 0
                or (t.use_vllm and getattr(t.args, "vllm_importance_sampling_correction", False))
                or batch.policy_versions is not None or self.credit.needs_old_logps(t))

    def old_logps(self, x: StepTensors, batch: RolloutBatch) -> torch.Tensor:
        t = self.trainer
        with torch.no_grad(), disable_gradient_checkpointing(t.model, t.args.gradient_checkpointing_kwargs):
            return t._get_per_token_logps_and_entropies(t.model, x.input_ids, x.attention_mask, x.length,
                                                        batch_size=self.batch_size(batch.mode))[0]

    def reference_logps(self, x: StepTensors, mode: str) -> torch.Tensor:
        t = self.trainer
        with torch.no_grad(), disable_gradient_checkpointing(t.model, t.args.gradient_checkpointing_kwargs):
            return t._reference_logps(x.input_ids, x.attention_mask, x.length, self.batch_size(mode))

    def batch_size(self, mode: str) -> int:
        args = self.trainer.args
        return args.per_device_train_batch_size if mode == "train" else args.per_device_eval_batch_size

    # -- 4. scores ----------------------------------------------------------------------------------------------------

    def score(self, rows: list[dict], batch: RolloutBatch) -> torch.Tensor:
        """(rows of every rank, reward sources): column 0 the environment's return under `reward_mode` (NaN for a
        failed episode or a padding row), then each `reward_funcs` with TRL's signature (None -> NaN), gathered."""
        t = self.trainer
        completions, completion_ids = batch.completions(), batch.completion_id_lists()
        prompts = [row["prompt"] for row in rows]
        scores = torch.full((len(rows), len(t.reward_funcs)), math.nan, device=t.accelerator.device)
        returns = [row["episode_return"] for row in rows]
        scores[:, 0] = torch.tensor([math.nan if r is None else r for r in returns], dtype=torch.float32)
        columns = {key: [row[key] for row in rows] for key in rows[0] if key not in ("prompt", "completion",
                                                                                     "completion_ids")}
        for i, (func, name) in enumerate(zip(t.reward_funcs[1:], t.reward_func_names[1:]), start=1):
            values = func(prompts=prompts, completions=completions, completion_ids=completion_ids,
                          trainer_state=t.state, log_extra=self.log_extra(batch.mode),
                          log_metric=self.log_metric(batch.mode), **columns)
            if inspect.isawaitable(values):
                values = asyncio.run(values)
            if len(values) != len(rows):
                raise ValueError(f"The reward function {name!r} returned {len(values)} rewards for {len(rows)} "
                                 "episodes: return one reward (or None) per episode")
            scores[:, i] = torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float32)
        return gather(scores)

    def log_extra(self, mode: str):
        """`log_extra(column, values)` for reward functions: a column of the completion logs (one value per row)."""
        def log(column: str, values: list) -> None:
            self.trainer._logs["extra"][column].extend(gather_object(list(values)))
        return log

    def log_metric(self, mode: str):
        """`log_metric(name, value)` for reward functions: a scalar metric, averaged over processes."""
        def log(name: str, value: float) -> None:
            value = torch.tensor(float(value), device=self.trainer.accelerator.device)
            self.trainer._metrics[mode][name].append(self.trainer.accelerator.gather(value).mean().item())
        return log

    # -- 6. off-policy corrections ------------------------------------------------------------------------------------

    def policy_lag_weights(self, x: StepTensors, old: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
        """`max_policy_lag`: each sampled token's truncated importance weight min(pi_old / pi_behaviour, cap) of the
        weights this step starts from over the snapshot that sampled it (`importance_weights`, "token_truncate":
        length-neutral). Scaling the advantage by w > 0 is the weighted loss for every loss_type but VESPO
        (refused): -min(r w A, clip(r) w A) = w * -min(r A, clip(r) A); CISPO and SAPO are linear in A with its
        sign kept."""
        weights, outside = importance_weights(old, x.sampled_logps, x.trained, "token_truncate", None,
                                              self.trainer.args.policy_lag_is_cap)
        self.log_weights(batch, weights, outside, x.trained)
        return weights

    def vllm_weights(self, x: StepTensors, old: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
        """vLLM's sampler against the trained model: `importance_weights` of w = pi_old / pi_vllm over the trained
        tokens, at `vllm_importance_sampling_mode`'s level (token, turn, geometric: length-neutral; TRL's sequence)
        truncated to [clip_min, clip_max] (`*_truncate`) or set to 0 outside it (`*_mask`)."""
        args, metrics = self.trainer.args, self.trainer._metrics[batch.mode]
        mode = args.vllm_importance_sampling_mode
        turns = turn_ids(batch.row_turn_spans(), x.length, old.device) if mode.startswith("turn_") else None
        weights, outside = importance_weights(old, x.sampled_logps, x.trained, mode,
                                              args.vllm_importance_sampling_clip_min,
                                              args.vllm_importance_sampling_clip_max, turns)
        token_difference = (old - x.sampled_logps).abs()[x.trained.bool()]
        if token_difference.numel():
            metrics["sampling/sampling_logp_difference/mean"].append(
                self.trainer.accelerator.gather(token_difference.nanmean()).nanmean().item())
            metrics["sampling/sampling_logp_difference/max"].append(
                self.trainer.accelerator.gather(token_difference.nan_to_num(0).max()).max().item())
        self.log_weights(batch, weights, outside, x.trained)
        return weights

    def log_weights(self, batch: RolloutBatch, weights: torch.Tensor, outside: torch.Tensor,
                    trained: torch.Tensor) -> None:
        """`sampling/importance_sampling_ratio/{min,mean,max,ess}` and the fractions of trained tokens and of
        episodes whose ratio was truncated or masked, `sampling/importance_sampling_clipped/{tokens,episodes}`
        (`weight_statistics`, this process's rows)."""
        metrics = self.trainer._metrics[batch.mode]
        for name, value in weight_statistics(weights, outside, trained, self.row_episodes(batch)).items():
            metrics[f"sampling/{name}"].append(value)

    @staticmethod
    def row_episodes(batch: RolloutBatch) -> list[int]:
        """Each row's episode, as an id: step-wise rows (and an agent's step samples) of one episode share it."""
        return [id(ep) for ep in batch.format.row_episodes(batch)]

    # -- 7. metrics ---------------------------------------------------------------------------------------------------

    def log(self, rows: list[dict], batch: RolloutBatch, x: StepTensors, advantages: torch.Tensor) -> None:
        """TRL's generation and reward metrics and completion logs (with the advantages the loss uses, per episode
        and per turn) and the episodes' own metrics."""
        t = self.trainer
        mode, metrics = batch.mode, t._metrics[batch.mode]
        prompt_tokens = t.accelerator.gather(x.prompt_mask.sum(dim=1)).sum()
        sampled = t.accelerator.gather(x.trained.sum(dim=1))
        if mode == "train":
            t.state.num_input_tokens_seen += (prompt_tokens + sampled.sum()).item()
        metrics["num_tokens"] = [t.state.num_input_tokens_seen]
        # TRL's completion metrics, of the sampled tokens per row; an episode cut by the turn or token budget is
        # what TRL calls clipped
        lengths = sampled.float()
        ended = ~t.accelerator.gather(torch.tensor([ep.truncated for ep in batch.format.row_episodes(batch)],
                                                   device=lengths.device))
        metrics["completions/mean_length"].append(lengths.mean().item())
        metrics["completions/min_length"].append(lengths.min().item())
        metrics["completions/max_length"].append(lengths.max().item())
        metrics["completions/clipped_ratio"].append(1.0 - ended.float().mean().item())
        terminated = lengths[ended] if ended.any() else torch.zeros(1, device=lengths.device)
        metrics["completions/mean_terminated_length"].append(terminated.mean().item())
        metrics["completions/min_terminated_length"].append(terminated.min().item())
        metrics["completions/max_terminated_length"].append(terminated.max().item())
        scores = batch.rewards_per_func
        for i, name in enumerate(t.reward_func_names):
            metrics[f"rewards/{name}/mean"].append(torch.nanmean(scores[:, i]).item())
            metrics[f"rewards/{name}/std"].append(nanstd(scores[:, i]).item())
        total = (scores * batch.reward_weights.to(scores.device)).nansum(dim=1)
        total[torch.isnan(scores).all(dim=1)] = math.nan
        metrics["reward"].append(torch.nanmean(total).item())
        metrics["reward_std"].append(nanstd(total).item())
        batch.format.log_reward_groups(metrics, total, batch.num_generations)
        t._logs["prompt"].extend(gather_object([row["prompt"] for row in rows]))
        t._logs["completion"].extend(gather_object(batch.completions()))
        for i, name in enumerate(t.reward_func_names):
            t._logs["rewards"][name].extend(scores[:, i].tolist())
        self.log_advantages(batch, advantages, x.trained)
        t._log_episode_metrics(batch)

    def log_advantages(self, batch: RolloutBatch, advantages: torch.Tensor, trained: torch.Tensor) -> None:
        """The advantages the loss uses in the completion logs: per row, `advantage` the mean of its (B, T)
        advantages over the tokens it trains on (NaN when none: a failed episode, one masked as truncated), and
        the extra column `turn_advantages` the same mean per turn, in turn order (one value repeated for
        trajectory-level estimators; PPO's token-level GAE averaged over each turn)."""
        t = self.trainer
        mask = trained.bool()
        counts = mask.sum(dim=1)
        per_row = torch.where(counts > 0, (advantages * mask).sum(dim=1) / counts.clamp(min=1), torch.nan)
        per_turn = [[round((advantages[i, s:e] * mask[i, s:e]).sum().item() / mask[i, s:e].sum().item(), 4)
                     for s, e in spans if mask[i, s:e].any()] for i, spans in enumerate(batch.row_turn_spans())]
        t._logs["advantages"].extend(t.accelerator.gather(per_row).tolist())
        t._logs["extra"]["turn_advantages"].extend(gather_object(per_turn))


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
    mean 0 and std 1 over every valid turn of the generation batch (RLOO's `normalize_advantages`).
    """

    def __init__(self, estimator: str, estimator_kwargs: dict | None, options: dict, kl_in_reward: float = 0.0,
                 normalize: bool = False):
        self.estimator = get_estimator(estimator)
        accepted = inspect.signature(self.estimator).parameters
        self.options = {**{k: v for k, v in options.items() if k in accepted}, **(estimator_kwargs or {})}
        self.kl_in_reward, self.normalize = kl_in_reward, normalize

    def needs_old_logps(self, trainer) -> bool:
        return self.kl_in_reward != 0.0

    def needs_reference(self, trainer) -> bool:
        return trainer.beta != 0.0

    def __call__(self, t, batch: RolloutBatch, x: StepTensors, old, ref) -> tuple[torch.Tensor, dict]:
        penalties = None
        if self.kl_in_reward and ref is not None:
            penalties = turn_kl_penalties(batch, old, ref, x.trained, self.kl_in_reward)
            t._log_masked_mean(batch.mode, "kl", old - ref, x.trained)
        advantages = self.token_advantages(t, batch, x.length, penalties)
        return advantages.to(x.completion_ids.device), {}

    def token_advantages(self, t, batch: RolloutBatch, length: int,
                         turn_penalties: list[list[float]] | None = None) -> torch.Tensor:
        """(rows, length) per-token advantages of this rank's rows; `turn_penalties` (per local episode, per turn)
        are subtracted from the turn rewards first."""
        rewards = batch.turn_rewards
        if turn_penalties is not None:
            rewards = [[r - p for r, p in zip(rs, ps)] for rs, ps in zip(rewards, turn_penalties)]
        local = [(r, not ep.failed, ep.turn_states) for r, ep in zip(rewards, batch.episodes)]
        everyone = gather_object(local)
        turn_rewards = with_trajectory_rewards([list(r) for r, _, _ in everyone], batch.rewards_per_func,
                                               batch.reward_weights, t.reward_func_names)
        credit = CreditBatch.from_lists(
            turn_rewards, group_ids=[i // batch.num_generations for i in range(len(everyone))],
            valid=[v for _, v, _ in everyone], observations=[o for _, _, o in everyone])
        turn_adv = self.turn_advantages(credit)
        log_credit_metrics(t._metrics[batch.mode], credit, turn_adv)
        start = batch.process_index * len(local)
        local_adv = batch.format.row_turn_advantages(batch, turn_adv[start: start + len(local)])
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
    per_turn = batch.format.turn_sums(batch, (old_logps - ref_logps) * trained)
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
