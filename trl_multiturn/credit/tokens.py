"""From per-turn advantages to the (B, T) per-token tensor that TRL's loss takes."""

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
