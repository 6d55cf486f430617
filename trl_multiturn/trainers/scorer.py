"""The step's scorer: every reward source's score of a step's rows, the environment's return first, then each of
the trainer's `reward_funcs` called with TRL's signature."""

from __future__ import annotations

import asyncio
import inspect
import math
from typing import TYPE_CHECKING, Callable

import torch
from accelerate.utils import gather

if TYPE_CHECKING:
    from ..rollout.episode import Episode
    from .batch import RolloutBatch
    from .step_log import StepLog


class Scorer:
    """`reward_funcs` and `reward_names`: the trainer's reward sources, the environment's return first (read from the
    batch's episodes with `episode_return`, the episode source's return under `reward_mode`, never called);
    `state()` the trainer's current `TrainerState` (TRL's `trainer_state` argument)."""

    def __init__(self, reward_funcs: list, reward_names: list[str], accelerator, state: Callable, log: StepLog,
                 episode_return: Callable[[Episode], float | None]):
        self.reward_funcs, self.reward_names = reward_funcs, reward_names
        self.accelerator, self.state, self.log = accelerator, state, log
        self.episode_return = episode_return

    def __call__(self, rows: list[dict], batch: RolloutBatch) -> torch.Tensor:
        """(rows of every rank, reward sources): column 0 the environment's return under `reward_mode` (NaN for a
        failed episode or a padding row), then each `reward_funcs` with TRL's signature (None -> NaN), gathered."""
        completions, completion_ids = batch.completions(), batch.completion_id_lists()
        prompts = [row["prompt"] for row in rows]
        scores = torch.full((len(rows), len(self.reward_funcs)), math.nan, device=self.accelerator.device)
        returns = batch.layout.row_returns(batch, self.episode_return)
        scores[:, 0] = torch.tensor([math.nan if r is None else r for r in returns], dtype=torch.float32)
        columns = {key: [row[key] for row in rows] for key in rows[0] if key not in ("prompt", "completion",
                                                                                     "completion_ids")}
        for i, (func, name) in enumerate(zip(self.reward_funcs[1:], self.reward_names[1:]), start=1):
            values = func(prompts=prompts, completions=completions, completion_ids=completion_ids,
                          trainer_state=self.state(), log_extra=self.log.extra(batch.mode),
                          log_metric=self.log.metric(batch.mode), **columns)
            if inspect.isawaitable(values):
                values = asyncio.run(values)
            if len(values) != len(rows):
                raise ValueError(f"The reward function {name!r} returned {len(values)} rewards for {len(rows)} "
                                 "episodes: return one reward (or None) per episode")
            scores[:, i] = torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float32)
        return gather(scores)
