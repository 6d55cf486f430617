"""`OpenEnvEnvironment`: an environment served over OpenEnv's protocol (a WebSocket session per episode slot),
played as our `Environment`.

OpenEnv (`openenv-core`, the `openenv` extra) serves an environment from a FastAPI app (`create_app`): each
WebSocket connection to `/ws` is one session with its own environment instance on the server; the client sends
`{"type": "reset", "data": {...}}` and `{"type": "step", "data": <action>}` and receives
`{"type": "observation", "data": {"observation": {...}, "reward": r, "done": d}}` (or `{"type": "error", ...}`).
This adapter drives such a session with OpenEnv's own client (`GenericEnvClient`, through its synchronous wrapper):

* `reset(task)` sends the task row as the reset argument `task` (`task_field`; None sends the row's fields as the
  reset arguments, e.g. `seed`), and returns the observation's `observation_field` as the first observation;
* `step(action)` sends `{action_field: action}` and returns a `StepResult` whose observation is the
  `observation_field` of the reply (None: the whole observation as JSON), whose reward is the server's step
  reward (None counts as 0), whose `done` is the server's, and whose `won` is the observation's `won_field` (an
  environment that reports no such field never wins: a win is never inferred from `done`).

The defaults speak what `trl-multiturn serve` serves (`TextAction` / `TextObservation` of
`commands/openenv_server.py`), so any of our environments served on another machine trains unchanged:
`environment_factory=partial(OpenEnvEnvironment, base_url="http://host:8000")`.

Failures fail the episode, never hang it: connecting has `connect_timeout` seconds, every reply
`message_timeout` seconds; a server that dies, times out, answers with an error or with something that is not an
observation raises `OpenEnvError` naming the server, the call and the cause. After any failure the session is
dropped (a late reply must not be read as the next one), and the next `reset` opens a fresh one. Otherwise one
session serves every episode of the slot (the server's environment is built once and reset per episode).
"""

from __future__ import annotations

import json
import math
import weakref
from dataclasses import dataclass, field
from typing import Any

from ..config_checks import Range, check_fields, config_field
from .base import Environment, StepResult


class OpenEnvError(RuntimeError):
    """An OpenEnv server failed a call: unreachable, died, timed out, answered with an error or with garbage."""


@dataclass
class OpenEnvConfig:
    """Options of `OpenEnvEnvironment`.

    Parameters:
        > Parameters that control the connection

        base_url (`str`, defaults to `"http://127.0.0.1:8000"`):
            The OpenEnv server (http://, https://, ws:// or wss://).
        connect_timeout (`float`, defaults to `30.0`):
            Seconds to open the WebSocket session before the episode fails.
        message_timeout (`float`, defaults to `120.0`):
            Seconds to wait for each reply of the server before the episode fails.

        > Parameters that control the messages

        action_field (`str`, defaults to `"message"`):
            The action's field that carries the model's reply.
        observation_field (`str`, defaults to `"text"`):
            The observation's field shown to the model (None: the whole observation as JSON).
        won_field (`str`, defaults to `"won"`):
            The observation's field that says the episode was won (None: never won).
        task_field (`str`, defaults to `"task"`):
            The reset argument that carries the task row (None: the row's fields are the reset's arguments).
    """

    # Parameters that control the connection
    base_url: str = field(
        default="http://127.0.0.1:8000",
        metadata={"help": "The OpenEnv server (http://, https://, ws:// or wss://; the session opens on /ws)."},
    )
    connect_timeout: float = config_field(
        30.0, "Seconds to open the WebSocket session before the episode fails.", range=Range(gt=0))
    message_timeout: float = config_field(
        120.0, "Seconds to wait for each reply of the server before the episode fails.", range=Range(gt=0))

    # Parameters that control the messages
    action_field: str = field(
        default="message",
        metadata={"help": "The action's field that carries the model's reply: the step sends {action_field: reply}."},
    )
    observation_field: str | None = field(
        default="text",
        metadata={"help": "The observation's field shown to the model. None: the whole observation as JSON."},
    )
    won_field: str | None = field(
        default="won",
        metadata={"help": "The observation's field that says the episode was won. None, or a field the server does "
                          "not send: episodes are never won."},
    )
    task_field: str | None = field(
        default="task",
        metadata={"help": "The reset argument that carries the task row. None: the row's fields are the reset's "
                          "arguments (e.g. seed, episode_id)."},
    )

    def __post_init__(self):
        check_fields(self)


class OpenEnvEnvironment(Environment):
    """One OpenEnv session at a time (see the module docstring). Build it with a config or its fields:
    `OpenEnvEnvironment(base_url="http://host:8000")`."""

    execution = "thread"  # every call waits on the network: a thread per call, no worker process

    def __init__(self, config: OpenEnvConfig | None = None, **kwargs: Any):
        if config is not None and kwargs:
            raise TypeError("pass either an OpenEnvConfig or its fields as keyword arguments, not both")
        self.config = config if config is not None else OpenEnvConfig(**kwargs)
        self._client = None  # OpenEnv's SyncEnvClient of the open session

    def reset(self, task: dict) -> str:
        data = {self.config.task_field: dict(task)} if self.config.task_field else dict(task)
        return self._call("reset", data).observation

    def step(self, action: str) -> StepResult:
        if self._client is None:
            raise OpenEnvError("no open session (the last call failed, or reset was never called): call reset(task)")
        return self._call("step", {self.config.action_field: action})

    def close(self) -> None:
        self._drop_session()

    def _call(self, what: str, data: dict) -> StepResult:
        from openenv.core import GenericEnvClient

        url = self.config.base_url
        try:
            if self._client is None:
                self._client = GenericEnvClient(base_url=url, connect_timeout_s=self.config.connect_timeout,
                                                message_timeout_s=self.config.message_timeout).sync()
                # The client's event-loop thread keeps it alive: an adapter dropped without close() would hold its
                # session (and the environment worker serving it) open on the server until this process exits.
                self._session_end = weakref.finalize(self, _end_session, self._client)
                self._client.connect()
            reply = self._client.reset(**data) if what == "reset" else self._client.step(data)
            return self._result(reply)
        except Exception as exc:
            self._drop_session()
            cause = f"no reply within message_timeout={self.config.message_timeout}s" \
                if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
            raise OpenEnvError(f"OpenEnv server {url}: {what} failed ({cause})") from exc

    def _result(self, reply) -> StepResult:
        """The server's reply as a `StepResult`; `OpenEnvError` when it is not an observation of this shape."""
        observation, reward, done = reply.observation, reply.reward, reply.done
        if not isinstance(observation, dict):
            raise OpenEnvError(f"the observation is {type(observation).__name__}, not an object: {observation!r:.200}")
        name = self.config.observation_field
        if name is None:
            text = json.dumps(observation, sort_keys=True)
        elif not isinstance(observation.get(name), str):
            raise OpenEnvError(f"the observation has no text field {name!r} (set observation_field; its fields: "
                               f"{sorted(observation)})")
        else:
            text = observation[name]
        if reward is None:
            reward = 0.0
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise OpenEnvError(f"the reward is {reward!r}, not a finite number")
        if not isinstance(done, bool):
            raise OpenEnvError(f"done is {done!r}, not a bool")
        won = bool(observation.get(self.config.won_field, False)) if self.config.won_field else False
        info = observation.get("info")
        return StepResult(text, float(reward), done, won and done, info if isinstance(info, dict) else {})

    def _drop_session(self) -> None:
        if self._client is not None:
            self._client = None
            self._session_end()


def _end_session(client) -> None:
    try:
        client.close()
    except Exception:  # noqa: BLE001 - the server may be gone; the session is dropped either way
        pass
