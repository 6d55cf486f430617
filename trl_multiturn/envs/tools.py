"""TRL-style tool environments as multi-turn `Environment`s.

TRL users write an environment for `GRPOTrainer(environment_factory=...)` as a class whose public methods are tools:

    class Counter:
        def reset(self, **row) -> str | None:      # the dataset row as keyword arguments; text added to the prompt
            self.count, self.reward, self.done = 0, 0.0, False
        def add(self, n: int) -> str:              # a tool: a docstring with `Args:` gives the model its schema
            \"\"\"Add n to the counter.

            Args:
                n: how much to add
            \"\"\"
            ...
        def get_reward(self) -> float:             # optional: the episode's reward so far (or a `reward` attribute)

`ToolEnvironment(Counter)` plays it as our `Environment`: `reset(task)` calls `reset(**task)` and returns the row's
prompt text (its `prompt` column, a string or chat messages) followed by what `reset` returned; `step(action)` runs
the tool calls of the action (the JSON list the "tool_calls" action parser reads from a reply, see
`trl_multiturn.rollout.tool_calls`) as TRL does (an unknown tool or an exception becomes an `{"error": ...}`
result the model sees) and returns their results as the observation, which reaches the model as a `role: "tool"`
message (`observation_role`), rendered by the chat template as it renders tool responses. Per-turn reward: how
much `get_reward()` (or the `reward` attribute) grew during the turn, so an episode's rewards sum to its final
reward. The episode ends when the environment sets `done = True`; it is won when the environment sets `won = True`,
or, for environments without a `won` attribute, when its reward reaches `success_reward` (if given). Never inferred
from `done` alone.

Show the model its tools with `tool_chat_template_kwargs(env_class)` as the config's `chat_template_kwargs` (the
tool schemas go into the chat template, as TRL renders them), and read its replies with `action_parser="tool_calls"`.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
from typing import Any, Callable

from .base import Environment, StepResult

RESERVED = ("reset", "get_reward")


def tool_methods(env) -> dict[str, Callable]:
    """The tools of a TRL-style environment instance, as TRL finds them: its class's public functions other than
    `reset` and `get_reward`, bound to the instance."""
    return {name: getattr(env, name) for name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
            if name not in RESERVED and not name.startswith("_")}


def tool_schemas(env_factory: Callable[[], Any]) -> list[dict]:
    """The JSON schemas of the tools of the environment `env_factory` builds (transformers' `get_json_schema`,
    from each method's signature and docstring)."""
    from transformers.utils import get_json_schema

    env = ToolEnvironment(env_factory)
    try:
        return [get_json_schema(method) for method in env.tools.values()]
    finally:
        env.close()


def tool_chat_template_kwargs(env_factory: Callable[[], Any]) -> dict:
    """`chat_template_kwargs` that show the model the environment's tools: `{"tools": tool_schemas(env_factory)}`."""
    return {"tools": tool_schemas(env_factory)}


def tool_environment(env_factory: Callable[[], Any], **kwargs) -> Callable[[], ToolEnvironment]:
    """A factory of `ToolEnvironment(env_factory, **kwargs)` for the trainers' `environment_factory` (a picklable
    `functools.partial`)."""
    return functools.partial(ToolEnvironment, env_factory, **kwargs)


class ToolEnvironment(Environment):
    """Runs a TRL-style tool environment (built by `env_factory`) as a multi-turn `Environment`; see the module
    docstring.

    Args:
        env_factory: a class or callable returning the TRL-style environment (built once, reset per episode).
        success_reward: for environments without a `won` attribute: the episode is won when it ends (`done`) with a
            reward of at least this. None: such environments never report a win.
    """

    observation_role = "tool"  # tool results reach the model as tool messages, as in TRL's tool loop

    def __init__(self, env_factory: Callable[[], Any], success_reward: float | None = None):
        self.env = env_factory()
        if not callable(getattr(self.env, "reset", None)):
            raise TypeError(f"{type(self.env).__name__} has no `reset` method: a TRL-style tool environment needs "
                            "reset(**row) and tool methods")
        self.tools = tool_methods(self.env)
        self.success_reward = success_reward
        self._reward_so_far = 0.0

    def reset(self, task: dict) -> str:
        extra = self.env.reset(**task)
        self._reward_so_far = self._reward()
        return _prompt_text(task.get("prompt")) + ("" if extra is None else str(extra))

    def step(self, action: str) -> StepResult:
        results = [self._call(call) for call in _calls(action)]
        observation = "\n".join(results)
        reward = self._reward()
        delta, self._reward_so_far = reward - self._reward_so_far, reward
        done = bool(getattr(self.env, "done", False))
        return StepResult(observation, reward=delta, done=done, won=done and self._won(reward),
                          info={"tool_calls": [c.get("name") for c in _calls(action)]})

    def close(self) -> None:
        """The environment's own `close()`, unless `close` is one of its tools (e.g. closing a door)."""
        close = getattr(self.env, "close", None)
        if callable(close) and "close" not in self.tools:
            close()

    def _call(self, call: dict) -> str:
        """One tool call's result as text, TRL's way: `str(result)`, or `{'error': ...}` when the tool is unknown,
        its arguments are not an object, or it raises."""
        name, arguments = call.get("name"), call.get("arguments", {})
        try:
            if name not in self.tools:
                raise ValueError(f"Tool {name} not found.")
            if not isinstance(arguments, dict):
                raise ValueError(f"the arguments of {name} must be a JSON object, got {arguments!r}")
            result = self.tools[name](**arguments)
        except Exception as exc:  # noqa: BLE001 - the model sees the error, as in TRL's tool loop
            result = {"error": str(exc)}
        return str(result)

    def _reward(self) -> float:
        get_reward = getattr(self.env, "get_reward", None)
        value = get_reward() if callable(get_reward) else getattr(self.env, "reward", 0.0)
        value = 0.0 if value is None else float(value)
        if not math.isfinite(value):
            raise ValueError(f"{type(self.env).__name__} reports a reward of {value}")
        return value

    def _won(self, reward: float) -> bool:
        if hasattr(self.env, "won"):
            return bool(self.env.won)
        return self.success_reward is not None and reward >= self.success_reward


def _calls(action: str) -> list[dict]:
    """The tool calls of an action: the "tool_calls" parser's JSON list (a single call object is accepted too)."""
    try:
        calls = json.loads(action)
    except json.JSONDecodeError:
        raise ValueError(f"action {action!r} is not a JSON list of tool calls: use action_parser='tool_calls'") \
            from None
    calls = [calls] if isinstance(calls, dict) else calls
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        raise ValueError(f"action {action!r} is not a JSON list of tool calls: use action_parser='tool_calls'")
    return calls


def _prompt_text(prompt) -> str:
    """The text of a TRL dataset row's `prompt`: a string, or the content of its last chat message."""
    if prompt is None:
        return ""
    if isinstance(prompt, str):
        return prompt
    last = prompt[-1]["content"] if prompt else ""
    return last if isinstance(last, str) else "".join(part.get("text", "") for part in last)
