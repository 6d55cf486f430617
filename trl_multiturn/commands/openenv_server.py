"""Our environments behind OpenEnv's server (`openenv-core`, the `openenv` extra): what `trl-multiturn serve` runs.

`served_app(factory)` is OpenEnv's own FastAPI app (`create_fastapi_app`) over `ServedEnvironment`, OpenEnv's
`Environment` base class wrapped around one of ours. Each WebSocket session (`/ws`) gets its own
`ServedEnvironment`, which runs our environment in a one-slot `EnvPool` (by default in a worker process of its
own, as the trainers run it): a crash, a hang past `env_timeout` or a broken contract fails that session's call
with an error reply, and the server and the other sessions go on. The session's environment is built once and
reset per episode; closing the session stops its worker.

Wire format (what OpenEnv's clients send and receive; `OpenEnvEnvironment`'s defaults):

* reset: `{"task": <dataset row>}`; `seed` (OpenEnv's own reset argument) fills the row's `seed` when the row has
  none, and `task_defaults` (the server's `--task`) fill the fields the row lacks, so `reset(seed=3)` alone plays
  game 3 of the configured kind;
* step: `TextAction`, `{"message": "<the model's reply>"}`;
* observation: `TextObservation`: `text`, `won`, `info` (our `StepResult.info`), with OpenEnv's `reward` (the
  turn's reward) and `done`.

OpenEnv's stateless HTTP `/reset` and `/step` build a fresh environment per request, so an episode needs the
WebSocket session (`EnvClient`, `GenericEnvClient`), as OpenEnv's own clients use.
"""

from __future__ import annotations

import functools
import json
import uuid
from typing import Any, Callable

from openenv.core.env_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment as OpenEnvBase
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from ..envs.base import Environment
from ..rollout.env_pool import EnvFailure, EnvPool


class TextAction(Action):
    """One reply of the model, as the action of a text environment (OpenEnv's text games name it `message`)."""

    message: str = Field(..., description="The model's action, e.g. a TextWorld command")


class TextObservation(Observation):
    """What one reset or step of a text environment returns, besides OpenEnv's `reward` and `done`."""

    text: str = Field(default="", description="The observation shown to the model")
    won: bool = Field(default=False, description="The environment's own verdict: the episode was won")
    info: dict[str, Any] = Field(default_factory=dict, description="The environment's StepResult.info")


class ServedEnvironment(OpenEnvBase):
    """One session's environment: ours, run in a one-slot `EnvPool` (see the module docstring)."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # every session has its own instance (and worker)

    def __init__(self, factory: Callable[[], Environment], env_mode: str = "auto", env_timeout: float | None = None,
                 task_defaults: dict | None = None):
        super().__init__()
        self._pool = EnvPool(factory, mode=env_mode, timeout=env_timeout)
        self._task_defaults = dict(task_defaults or {})
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, task: dict | None = None,
              **kwargs: Any) -> TextObservation:
        if task is not None and not isinstance(task, dict):
            raise ValueError(f"reset: `task` must be a dataset row (a JSON object), got {task!r}")
        row = {**self._task_defaults, **(task or {})}
        if seed is not None and "seed" not in (task or {}):
            row["seed"] = seed
        if not row:
            raise ValueError("reset needs the task row: send reset(task={...}) (or start the server with --task, "
                             "then reset(seed=N))")
        [first] = self._pool.reset([row])
        if isinstance(first, EnvFailure):
            raise RuntimeError(first.reason)
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return TextObservation(text=first)

    def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        [result] = self._pool.step([0], [action.message])
        if isinstance(result, EnvFailure):
            raise RuntimeError(result.reason)
        self._state.step_count += 1
        info = json.loads(json.dumps(result.info, default=str))  # e.g. a Path in info travels as its text
        return TextObservation(text=result.observation, reward=result.reward, done=result.done, won=result.won,
                               info=info)

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        self._pool.close()


def served_app(factory: Callable[[], Environment], max_sessions: int = 64, env_mode: str = "auto",
               env_timeout: float | None = None, task_defaults: dict | None = None):
    """OpenEnv's FastAPI app serving the environments `factory` builds, up to `max_sessions` sessions at once."""
    session = functools.partial(ServedEnvironment, factory, env_mode=env_mode, env_timeout=env_timeout,
                                task_defaults=task_defaults)
    return create_fastapi_app(session, TextAction, TextObservation, max_concurrent_envs=max_sessions)
