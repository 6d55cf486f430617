"""Importance weights of the sampled tokens, and the weight of an episode that becomes several rows: pure functions.

Two corrections weigh a sampled token's loss by pi_old / pi_behaviour: vLLM's sampler against the trained model
(`vllm_importance_sampling_*`, GRPO and PPO) and a policy snapshot's rollout (`max_policy_lag`). Both come from
`importance_weights`, whose `mode` is `<level>_<constraint>`:

    level        log rho of a token t of row i, d_t = log pi_old(y_t) - log pi_behaviour(y_t) on trained tokens
    token        d_t                                         (TRL's "token_*")
    turn         mean of d over the trained tokens of t's turn      (geometric mean per turn)
    geometric    mean of d over the trained tokens of row i          (geometric mean per row)
    sequence     sum of d over the trained tokens of row i           (TRL's "sequence_*": a product over the row)

    truncate     w = clamp(rho, clip_min, clip_max)
    mask         w = rho inside [clip_min, clip_max], else 0

In the trajectory format a row is a whole episode, so a `sequence` weight is a product over every token the model
sampled in every turn: with the same per-token ratio r != 1, an episode of n tokens weighs r^n and a 60-turn
episode is masked (or truncated to the bound) where a one-turn episode of the same sampler is not. The other
levels are **length-neutral** (DESIGN invariant 19): equal per-token ratios give equal weights whatever the number
of tokens or turns. `token_truncate` is the multi-turn default: it is TRL's per-token truncated IS, the correction
the policy lag already used, and it keeps every token of a long episode with a bounded weight instead of dropping
or keeping the episode whole (docs/vllm.md, "Importance sampling").

`episode_row_weights` is the other weight: how much an episode counts in a loss that averages each row first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

LEVELS = ("token", "turn", "geometric", "sequence")
CONSTRAINTS = ("truncate", "mask")
IMPORTANCE_SAMPLING_MODES = tuple(f"{level}_{constraint}" for level in LEVELS for constraint in CONSTRAINTS)
LENGTH_NEUTRAL_MODES = tuple(m for m in IMPORTANCE_SAMPLING_MODES if not m.startswith("sequence_"))
DEFAULT_MODE = "token_truncate"


def check_importance_sampling(mode: str, clip_min: float | None, clip_max: float | None) -> None:
    """Raise a one-line ValueError naming the field, the value and the fix for a mode this module does not know
    or bounds that leave a `*_truncate` mode nothing to truncate to (TRL's own rule for its truncate modes)."""
    if mode not in IMPORTANCE_SAMPLING_MODES:
        raise ValueError(f"vllm_importance_sampling_mode={mode!r}: choose one of {IMPORTANCE_SAMPLING_MODES} "
                         f"(default {DEFAULT_MODE!r}; the sequence_* modes weigh a long episode by a product over "
                         "all its tokens)")
    if mode.endswith("_truncate") and clip_min is None and clip_max is None:
        raise ValueError(f"vllm_importance_sampling_mode={mode!r} with vllm_importance_sampling_clip_min=None and "
                         "vllm_importance_sampling_clip_max=None truncates nothing: set clip_max (TRL's default "
                         "is 3.0) or choose a *_mask mode")


def turn_ids(spans: Sequence[Sequence[tuple[int, int]]], length: int, device=None) -> torch.Tensor:
    """(rows, length) index of the turn each completion position belongs to (-1 outside every turn), from each
    row's turn spans `[(start, end), ...]` (`RolloutBatch.row_turn_spans()`)."""
    ids = torch.full((len(spans), length), -1, dtype=torch.long, device=device)
    for row, row_spans in enumerate(spans):
        for k, (start, end) in enumerate(row_spans):
            ids[row, start:end] = k
    return ids


def importance_weights(current_logps: torch.Tensor, behaviour_logps: torch.Tensor, mask: torch.Tensor, mode: str,
                       clip_min: float | None, clip_max: float | None,
                       turns: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, outside): the importance weights of `mode` (the module docstring's table) and, of the same shape,
    whether each ratio was outside [clip_min, clip_max] (truncated or masked).

    `current_logps`, `behaviour_logps`, `mask`: (B, T); a NaN behaviour log-prob (none reported) counts as
    d_t = 0, as in TRL. `turns`: (B, T) turn index (`turn_ids`), needed by the `turn` level. The weights are (B, T)
    for the token and turn levels and (B, 1) for the row levels (TRL's shapes; the loss broadcasts them)."""
    check_importance_sampling(mode, clip_min, clip_max)
    level = mode.rsplit("_", 1)[0]
    mask = mask.to(current_logps.dtype)
    d = torch.nan_to_num((current_logps - behaviour_logps) * mask, nan=0.0)
    if level == "sequence":
        log_ratio = d.sum(dim=-1, keepdim=True)
    elif level == "geometric":
        log_ratio = d.sum(dim=-1, keepdim=True) / mask.sum(dim=-1, keepdim=True).clamp(min=1)
    elif level == "turn":
        if turns is None:
            raise ValueError("the 'turn' importance sampling level needs each token's turn index (turn_ids)")
        log_ratio = segment_means(d, mask, turns)
    else:
        log_ratio = d
    ratio = torch.exp(log_ratio)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    outside = (ratio < low) | (ratio > high)
    if mode.endswith("_truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max), outside
    return ratio.masked_fill(outside, 0.0), outside


def segment_means(values: torch.Tensor, mask: torch.Tensor, segments: torch.Tensor) -> torch.Tensor:
    """(B, T): at each position, the mean of `values` over the masked positions of its row's segment (`segments`
    (B, T), -1: none; such positions get their own value)."""
    slots = segments + 1  # slot 0 collects the positions outside every segment
    width = int(slots.max().item()) + 1 if slots.numel() else 1
    sums = values.new_zeros(values.size(0), width).scatter_add_(1, slots, values * mask)
    counts = values.new_zeros(values.size(0), width).scatter_add_(1, slots, mask)
    means = (sums / counts.clamp(min=1)).gather(1, slots)
    return torch.where(segments >= 0, means, values)


def weight_statistics(weights: torch.Tensor, outside: torch.Tensor, trained: torch.Tensor,
                      row_episodes: Sequence[int]) -> dict[str, float]:
    """What a step logs of its importance weights (under `sampling/`), over the trained tokens (`trained` (B, T);
    `weights` and `outside` (B, T) or (B, 1)); empty when no token is trained:

        importance_sampling_ratio/min, mean, max   of the weights per trained token (TRL's names)
        importance_sampling_ratio/ess              the normalised effective sample size (sum w)^2 / (N sum w^2) over
                                                   the N trained tokens: 1 when every weight is equal, 1/N when one
                                                   token carries them all (0 when all are 0)
        importance_sampling_clipped/tokens         the fraction of trained tokens whose ratio was truncated or masked
        importance_sampling_clipped/episodes       the fraction of episodes with such a token (`row_episodes`: each
                                                   row's episode; an episode's step rows count it once)
    """
    token = trained.bool()
    w = weights.expand_as(trained)[token].double()
    if not w.numel():
        return {}
    out = outside.expand_as(trained) & token
    squares = (w * w).sum()
    episodes: dict[int, bool] = {}
    for row, episode in enumerate(row_episodes):
        if token[row].any():
            episodes[episode] = episodes.get(episode, False) or bool(out[row].any())
    ratio, clipped = "importance_sampling_ratio", "importance_sampling_clipped"
    return {f"{ratio}/min": w.min().item(), f"{ratio}/mean": w.mean().item(), f"{ratio}/max": w.max().item(),
            f"{ratio}/ess": (w.sum() ** 2 / (w.numel() * squares)).item() if squares > 0 else 0.0,
            f"{clipped}/tokens": out.sum().item() / w.numel(),
            f"{clipped}/episodes": sum(episodes.values()) / len(episodes)}


def episode_row_weights(row_episodes: Sequence[int], trained: torch.Tensor) -> torch.Tensor:
    """(rows, 1) weights that make each episode count once in a loss that averages each row first:

        c_r = R / (E * k_e)    for a row r of episode e that trains a token,    1 for a row that trains none

    where k_e is the number of rows of episode e that train a token, E the number of such episodes and R the number
    of such rows. The k_e rows of an episode then weigh sum c_r / R = 1 / E together, as its single row does in the
    trajectory format (a per-episode mean), and the weights average 1 over the trained rows, so the loss keeps its
    scale. `row_episodes`: each row's episode (any hashable id); `trained`: (rows, T) the trained-token mask."""
    trains = trained.bool().any(dim=1).tolist()
    counts: dict[int, int] = {}
    for episode, t in zip(row_episodes, trains):
        if t:
            counts[episode] = counts.get(episode, 0) + 1
    rows, episodes = sum(counts.values()), len(counts)
    weights = [rows / (episodes * counts[e]) if t else 1.0 for e, t in zip(row_episodes, trains)]
    return torch.tensor(weights, dtype=torch.float32, device=trained.device).unsqueeze(1)


def row_mean_loss(config) -> bool:
    """Whether the trainer's loss averages each row over its tokens before averaging the rows, so that every row
    counts once whatever its length: GRPO's `loss_type` 'grpo' and 'sapo' (TRL's per-sequence means) and RLOO's
    `loss_granularity='episode'` (one ratio per row). The other losses sum tokens (dapo, bnpo, dr_grpo, cispo,
    luspo, PPO's, RLOO's per-turn segments): an episode weighs by its tokens (or turns) however many rows hold
    them."""
    return getattr(config, "loss_type", None) in ("grpo", "sapo") or \
        getattr(config, "loss_granularity", None) == "episode"
