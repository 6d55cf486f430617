"""The environment contract: a Gymnasium-sized `reset` / `step` / `close` over text."""

from __future__ import annotations

import math
import reprlib
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping


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
    returns a fresh instance) and calls `reset(task)` with one dataset row before each episode. What `reset` and
    `step` return is checked (`checked_observation`, `checked_step_result`): a result that breaks the contract fails
    its episode like an exception does.
    """

    execution: ClassVar[str] = "process"
    """How trainers run instances of this environment under `env_mode="auto"`: "process" (each episode's
    environment in its own worker process: for CPU-bound engines, and the safe default since a crash, a hang or a
    leak stays in that process) or "thread" (each call on its own thread of the trainer process: for environments
    whose work waits on I/O or subprocesses)."""

    call_timeout: ClassVar[float | None] = None
    """Seconds one `reset`/`step`/`finish` call may take before its episode fails, when the trainer's `env_timeout`
    is None (the trainer's value wins; not applied under `env_mode="inline"`, which cannot interrupt a call). None:
    no deadline. An environment whose calls run other programs should declare a generous bound."""

    observation_role: ClassVar[str] = "user"
    """The chat role each step's observation reaches the model in: "user" (the default: the environment speaks as
    the user), or "tool" (tool results, as TRL's tool loop sends them: the chat template's tool-message rendering,
    e.g. `<tool_response>` blocks; `ToolEnvironment` declares it). The first observation is always the user's."""

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

    def expert_action(self) -> str | None:
        """The expert's action for the episode's current state (after `reset` and the `step`s so far), or None where
        the expert has none (the episode is over, or the game can no longer be won).

        DAgger (`MultiTurnDAggerTrainer`) labels every state the student reaches with it; an environment opts in by
        overriding it (TextWorld and ALFWorld do). Overriding it is optional: `has_expert_action` tells whether an
        environment did.
        """
        raise NotImplementedError(f"{type(self).__name__} has no per-state expert: override `expert_action()`")


def has_expert_action(env: Environment) -> bool:
    """Whether `env`'s class provides `Environment.expert_action` (overrides the base method)."""
    return getattr(type(env), "expert_action", Environment.expert_action) is not Environment.expert_action


EnvironmentFactory = Callable[[], Environment]


class TaskError(ValueError):
    """A task row the environment cannot load; the message names the field and the fix."""


class ContractError(TypeError):
    """What an environment returned breaks the contract: an observation that is not a string, a reward that is not a
    finite number, a `done` or `won` that is not a truth value, an `info` that is not a dict."""


def checked_observation(value: Any, what: str = "observation") -> str:
    """`value` if it is a string; otherwise `ContractError`."""
    if not isinstance(value, str):
        raise ContractError(f"{what} is {type(value).__name__} {reprlib.repr(value)}, not a str")
    return value


def checked_step_result(result: Any) -> StepResult:
    """A `StepResult` with a str observation, a finite float reward, bool done/won and a dict info; otherwise
    `ContractError` naming the field. A reward that is None, NaN, infinite or not a number is refused: it would
    reach the advantages, and one NaN there makes every parameter NaN in one optimizer step."""
    if not isinstance(result, StepResult):
        raise ContractError(f"returned {type(result).__name__} {reprlib.repr(result)}, not a StepResult")
    observation = checked_observation(result.observation)
    reward = result.reward
    try:
        if isinstance(reward, (str, bytes)):
            raise TypeError
        value = float(reward)
    except (TypeError, ValueError):
        raise ContractError(f"reward is {type(reward).__name__} {reprlib.repr(reward)}, not a number") from None
    if not math.isfinite(value):
        raise ContractError(f"reward is {value}, not a finite number")
    info = {} if result.info is None else result.info
    if not isinstance(info, Mapping):
        raise ContractError(f"info is {type(info).__name__} {reprlib.repr(info)}, not a dict")
    return StepResult(observation, value, _truth(result.done, "done"), _truth(result.won, "won"), dict(info))


def _truth(value: Any, name: str) -> bool:
    try:
        return bool(value)
    except Exception as exc:  # noqa: BLE001 - e.g. a numpy array of several values
        raise ContractError(f"{name} is {type(value).__name__} {reprlib.repr(value)}, not a truth value "
                            f"({type(exc).__name__}: {exc})") from None
