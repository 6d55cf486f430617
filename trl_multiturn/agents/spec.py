"""An agent named on a command line (`trl-multiturn eval --agent` / `--agent_command`) as an `AgentEnvironment`."""

from __future__ import annotations

import inspect
import shlex

from ..envs.suites import load_entry_point
from .process import AgentCommand
from .runner import AgentEnvironment


def agent_environment(agent: str | None = None, command: str | None = None) -> AgentEnvironment:
    """The `AgentEnvironment` of `agent`, a `"package.module:name"` path to an `AgentEnvironment`, an `AgentCommand`,
    an agent function `(task_row, session) -> reward`, or a function of no arguments that returns one of those (e.g.
    `trl_multiturn.agents.mini_swe_agent:mini_swe_agent_environment`); or of `command`, a command line run per
    episode (`AgentCommand(shlex.split(command))`)."""
    if (agent is None) == (command is None):
        raise ValueError(f"agent={agent!r}, agent_command={command!r}: give one of them (a 'package.module:name' "
                         "path to an agent, or a command line)")
    if command is not None:
        return AgentEnvironment(AgentCommand(shlex.split(command)))
    if ":" not in agent:
        raise ValueError(f"agent={agent!r}: give a 'package.module:name' path to an agent function, an AgentCommand "
                         "or an AgentEnvironment")
    try:
        obj = load_entry_point(agent)
    except Exception as exc:  # an import runs the module's code: any error means "this path is not usable"
        raise ValueError(f"agent={agent!r} cannot be loaded ({type(exc).__name__}: {exc}): give a "
                         "'package.module:name' path importable here") from None
    if callable(obj) and not isinstance(obj, (AgentEnvironment, AgentCommand)) and not _required_parameters(obj):
        obj = obj()
    if isinstance(obj, AgentEnvironment):
        return obj
    if callable(obj):
        return AgentEnvironment(obj)
    raise ValueError(f"agent={agent!r} names a {type(obj).__name__}: name an agent function (task_row, session) -> "
                     "reward, an AgentCommand or an AgentEnvironment")


def _required_parameters(fn) -> list[str]:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ["?"]
    return [p.name for p in parameters if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY,
                                                                               p.POSITIONAL_OR_KEYWORD)]
