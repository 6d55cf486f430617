"""`StepTensors`: a step's rows as the padded tensors TRL's losses read, which the step builds once and every part
(forwards, credit, log) reads."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch


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
