"""Dynamic sampling (DAPO's, for multi-turn groups): a training step keeps drawing tasks until it holds the groups it
trains on with rewards that differ, and a task whose group keeps tying can be set aside for a while.

A group (the `num_generations` episodes of one task) whose returns all tie has advantage 0 under every group
baseline: it trains nothing, yet it fills the batch. With `dynamic_sampling=True` the step plays TRL's rows (its
first draw), keeps the groups whose returns differ, and plays further draws of tasks from the training dataset until
it holds as many such groups as TRL's rows had, or it has played `dynamic_sampling_max_draws` draws. Then:

- the first groups with signal, in the order played, are trained; when too few were found, tied groups (the first
  played) fill the batch to its size (TRL's batch shape is fixed) and are counted (`tied_groups_trained`);
- every other group played is dropped from this step and counted (`dropped_groups`): episodes played are never
  kept for a later step (they would be off-policy there) nor dropped silently. With `save_episodes` they are saved
  beside the trained ones (`...-dropped.parquet`).

Curriculum by difficulty (`dynamic_sampling_set_aside_steps = s > 0`): a task whose group tied in
`dynamic_sampling_set_aside_ties` plays in a row (all won: too easy; all lost: too hard for now) is set aside for `s`
optimizer steps: draws skip it, and a set-aside task among TRL's rows is replaced by a drawn one before it is played.

The pure parts (`tied_groups`, `draw_size`, `select_groups`, `TaskShelf`) hold the rules; `DynamicSampler` runs the
draws with the `play` function it is handed. Each process decides on its own rows (its rows hold whole groups), but
every process plays the same number of draws, so that the ranks' generate calls stay in step.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from ..rollout import Episode


def tied_groups(returns: Sequence[float | None], group_size: int) -> list[bool]:
    """Per group of `group_size` consecutive episodes, whether it carries no learning signal: fewer than two of its
    episodes have a return (None: the episode failed) or all of those returns are equal."""
    groups = [returns[i: i + group_size] for i in range(0, len(returns), group_size)]
    return [len({r for r in group if r is not None}) < 2 for group in groups]


def draw_size(missing: int, played: int, kept: int, batch_groups: int) -> int:
    """How many groups the next draw plays: enough to find the `missing` groups at the rate seen so far this step
    (`kept` groups with signal out of `played`), at most a batch's `batch_groups`, at least one:

        n = clip(ceil(missing * played / kept), missing, batch_groups)     (kept = 0: n = batch_groups)

    A process that lacks none still plays one group, so that every process makes the same generate calls."""
    if missing <= 0:
        return 1
    wanted = batch_groups if kept == 0 else math.ceil(missing * played / kept)
    return max(1, min(batch_groups, max(missing, wanted)))


def select_groups(tied: Sequence[bool], needed: int) -> tuple[list[int], list[int]]:
    """From the groups played, in play order, with their tie flags: (the `needed` groups to train, the others).
    The first groups with signal are trained; when there are fewer than `needed`, the first tied groups fill the
    rest. Both lists hold indices in play order."""
    signal = [i for i, t in enumerate(tied) if not t]
    filling = [i for i, t in enumerate(tied) if t][: max(0, needed - len(signal))]
    trained = sorted(signal[:needed] + filling)
    chosen = set(trained)
    return trained, [i for i in range(len(tied)) if i not in chosen]


def task_key(row: dict) -> str:
    """A task row's identity for the curriculum: a digest of its columns and values."""
    text = json.dumps(row, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


@dataclass
class TaskShelf:
    """The tasks set aside by the curriculum: a task whose group tied in `ties` plays in a row is set aside for
    `steps` optimizer steps (from the step it last tied at); a group with signal resets its count."""

    steps: int
    ties: int
    streaks: dict[str, int] = field(default_factory=dict)
    until: dict[str, int] = field(default_factory=dict)

    def record(self, key: str, tied: bool, step: int) -> bool:
        """Count one play of task `key` at optimizer step `step`; True when it is set aside by this play."""
        if not tied:
            self.streaks.pop(key, None)
            return False
        self.streaks[key] = self.streaks.get(key, 0) + 1
        if self.streaks[key] < self.ties:
            return False
        self.streaks.pop(key)
        self.until[key] = step + self.steps
        return True

    def is_aside(self, key: str, step: int) -> bool:
        """Whether task `key` is set aside at optimizer step `step` (available again from step `until`)."""
        return self.until.get(key, step) > step

    def count(self, step: int) -> int:
        """How many tasks are set aside at `step` (the ones whose time is over are forgotten)."""
        self.until = {key: end for key, end in self.until.items() if end > step}
        return len(self.until)


@dataclass
class DynamicDraws:
    """What one step's dynamic sampling played: `rows` and `episodes` to train on (whole groups, TRL's row count),
    the `dropped` episodes (played, not trained) and the counts the step logs (`StepLog.dynamic_sampling`)."""

    rows: list[dict]
    episodes: list[Episode]
    dropped: list[Episode]
    counts: dict[str, float]


class DynamicSampler:
    """Runs dynamic sampling for one process (see the module docstring).

    `tasks`: the training dataset (indexable rows, drawn from at random with a generator seeded by `seed`, the step,
    the process and the draw); `group_size`: `num_generations`; `max_draws`: the most draws one step plays, TRL's
    rows the first; `shelf`: the curriculum (None: off); `any_rank(flag)`: whether `flag` holds on any process."""

    def __init__(self, tasks, group_size: int, max_draws: int, shelf: TaskShelf | None, seed: int,
                 process_index: int, any_rank: Callable[[bool], bool]):
        self.tasks, self.group_size, self.max_draws, self.shelf = tasks, group_size, max_draws, shelf
        self.seed, self.process_index, self.any_rank = seed, process_index, any_rank

    def __call__(self, inputs: list[dict], play: Callable[[list[dict]], list[Episode]],
                 episode_return: Callable[[Episode], float | None], step: int) -> DynamicDraws:
        """Play `inputs` (TRL's rows, whole groups), then further draws while any process lacks groups with signal;
        `episode_return` is an episode's return (None: failed), `step` the optimizer step being trained."""
        size = self.group_size
        needed = len(inputs) // size
        groups: list[tuple[list[dict], list[Episode]]] = []  # (rows, episodes) per group played, in play order
        tied: list[bool] = []
        rows, replaced = self.replace_set_aside(inputs, step)
        draws, newly_aside = 0, 0
        while True:
            episodes = play(rows)
            draws += 1
            group_tied = tied_groups([episode_return(ep) for ep in episodes], size)
            for g, flag in enumerate(group_tied):
                span = slice(g * size, (g + 1) * size)
                groups.append((rows[span], episodes[span]))
                tied.append(flag)
                if self.shelf is not None:
                    newly_aside += self.shelf.record(task_key(rows[g * size]), flag, step)
            missing = needed - tied.count(False)
            if draws >= self.max_draws or not self.any_rank(missing > 0):
                break
            rows = self.draw(draw_size(missing, len(tied), tied.count(False), needed), step, draws)
        trained, dropped = select_groups(tied, needed)
        counts = {
            "draws": float(draws),
            "groups_played": float(len(tied)),
            "tied_groups": float(sum(tied)),
            "groups_kept": float(sum(not tied[i] for i in trained)),
            "tied_groups_trained": float(sum(tied[i] for i in trained)),
            "dropped_groups": float(len(dropped)),
        }
        if self.shelf is not None:
            counts.update(set_aside_tasks=float(self.shelf.count(step)), newly_set_aside=float(newly_aside),
                          replaced_tasks=float(replaced))
        return DynamicDraws(rows=[r for i in trained for r in groups[i][0]],
                            episodes=[ep for i in trained for ep in groups[i][1]],
                            dropped=[ep for i in dropped for ep in groups[i][1]], counts=counts)

    def replace_set_aside(self, inputs: list[dict], step: int) -> tuple[list[dict], int]:
        """TRL's rows with each group whose task is set aside replaced by a drawn task; and how many were."""
        if self.shelf is None:
            return inputs, 0
        size, rows, replaced = self.group_size, [], 0
        rng = self.rng(step, 0)
        for g in range(0, len(inputs), size):
            group = inputs[g: g + size]
            if self.shelf.is_aside(task_key(group[0]), step):
                group = [self.pick(rng, step)] * size
                replaced += 1
            rows.extend(group)
        return rows, replaced

    def draw(self, groups: int, step: int, draw: int) -> list[dict]:
        """`groups` tasks drawn from the dataset (skipping set-aside ones), each repeated `group_size` times."""
        rng = self.rng(step, draw)
        return [row for _ in range(groups) for row in [self.pick(rng, step)] * self.group_size]

    def pick(self, rng: random.Random, step: int, tries: int = 32) -> dict:
        """One task drawn uniformly from those not set aside (after `tries` set-aside ones in a row: the last)."""
        for _ in range(tries):
            row = dict(self.tasks[rng.randrange(len(self.tasks))])
            if self.shelf is None or not self.shelf.is_aside(task_key(row), step):
                return row
        return row

    def rng(self, step: int, draw: int) -> random.Random:
        return random.Random(f"dynamic-sampling-{self.seed}-{step}-{self.process_index}-{draw}")
