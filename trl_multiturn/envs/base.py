"""The environment contract: a Gymnasium-sized `reset` / `step` / `close` over text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class StepResult:
    """What one `Environment.step` returns.

    `won` is reported by the environment itself and is never inferred from `done`: an episode can end lost
    (`done=True, won=False`). `reward` is this turn's own reward (e.g. a TextWorld score delta).
    """

    observation: str
    reward: float = 0.0
    done: bool = False
    won: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Environment:
    """Subclass and implement `reset` and `step`; `close` releases what the environment holds.

    A trainer builds one environment per concurrent episode through `environment_factory` (any callable that
    returns a fresh instance) and calls `reset(task)` with one dataset row before each episode.
    """

    def reset(self, task: dict) -> str:
        """Start the episode named by `task` (one dataset row) and return the first observation."""
        raise NotImplementedError

    def step(self, action: str) -> StepResult:
        """Apply one parsed action and return what happened."""
        raise NotImplementedError

    def close(self) -> None:
        """Release processes, files and games held by the environment."""

    def finish(self) -> StepResult | None:
        """Called when the rollout cuts a live episode (turn or token budget) before the environment said done.

        An environment that can still score the episode returns a final result (SWE-Gym grades the current diff);
        its reward is added to the last turn and its `won` decides the episode. The default returns None.
        """
        return None

    def expert_actions(self, task: dict) -> list[str] | None:
        """The expert solution of `task` as a list of actions, or None where the environment has none.

        Used to build supervised (SFT) trajectories; overriding it is optional.
        """
        return None


EnvironmentFactory = Callable[[], Environment]


class TaskError(ValueError):
    """A task row the environment cannot load; the message names the field and the fix."""
