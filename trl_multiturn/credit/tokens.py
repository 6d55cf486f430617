"""Per-turn values and per-token tensors: the turns of a (B, T) sampled-token mask, and per-turn advantages
broadcast to the (B, T) tensor that TRL's loss takes (used by the estimators, GAE and RLOO's loss alike)."""

from __future__ import annotations

import torch


def turn_to_token_advantages(turn_advantages: torch.Tensor, turn_spans: list[list[tuple[int, int]]],
                             length: int) -> torch.Tensor:
    """A[i, t] = turn_advantages[i, k] for every token t of turn k's sampled span, 0 elsewhere (observation,
    template and padding tokens, which the env mask also keeps out of the loss)."""
    out = torch.zeros(len(turn_spans), length, dtype=turn_advantages.dtype)
    for i, spans in enumerate(turn_spans):
        for k, (start, end) in enumerate(spans):
            out[i, start:end] = turn_advantages[i, k]
    return out


def turn_starts(mask: torch.Tensor) -> torch.Tensor:
    """True on the first sampled token of each turn. A turn is a maximal run of sampled tokens: consecutive replies
    are always separated by the chat template's tokens for the observation, which are never sampled."""
    mask = mask.bool()
    before = torch.nn.functional.pad(mask[:, :-1], (1, 0), value=False)
    return mask & ~before


def turn_index(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) long: k on the tokens of turn k (0-based), -1 where `mask` is False."""
    index = torch.cumsum(turn_starts(mask).long(), dim=1) - 1
    return torch.where(mask.bool(), index, -1)
