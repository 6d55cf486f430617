"""verifiers' environments (verifiers 0.4, `verifiers.v1`) trained through the chat endpoint, turn by turn with their
tools, their rubric as the reward.

A verifiers environment is a taskset (its tasks: a prompt, an optional system prompt, the task's tool servers,
`Task.toolsets`, and its `@vf.reward` functions, its rubric) played by a harness (an agent program verifiers launches
in a runtime, whose model calls its interception server forwards to the model). verifiers 0.4 has no `MultiTurnEnv`
or `ToolEnv`: a tool environment is a task whose toolsets (`vf.Toolset`, `@vf.tool` methods) its harness calls over
MCP, and the multi-turn loop is the harness's. Its plain harness (`null`) is a chat program that verifiers launches as
a PEP 723 `uv` script, resolving its dependencies and bootstrapping `uv` itself at run time, and each toolset is an
MCP server it builds and installs with `uv` too: that needs the network, which training here does not have.

So here that same chat program runs in the trainer's process: the text verifiers would launch
(`verifiers.v1.harnesses.utils.launch.CHAT_PROGRAM_SOURCE`, unmodified) is loaded as a module, and its own
`run_chat_loop` plays the episode against the training endpoint (streamed chat completions, the task's tools,
tool errors as the model's tool results, until a reply without tool calls), calling the task's toolsets through its
own `connect_mcp`/`call_mcp`; the one part swapped is its MCP connection class, for one that reaches each toolset's
MCP server (built by the toolset's own `register`) in this process through `mcp.Client` instead of over HTTP. The
conversation it ends with becomes verifiers' `Trace` (the root node carrying the tools, the model's replies marked
sampled) and verifiers' own `task.score(trace)` scores it: the weighted sum of the task's rewards is the episode's
reward. A rubric that raises fails its episode, and so does one whose reward did not run (verifiers skips a reward
that needs a runtime, a sandbox this harness does not start, and records None): a reward left out is no reward of 0.
A request the endpoint refuses past `max_turns` ends the loop and the conversation so far is scored. Limits: a
toolset's state (`vf.State` fields) does not persist between its calls (verifiers syncs it through its interception
server's state channel, which is not run here), and taskset-wide shared toolsets are not served.

    rows, environment = verifiers_environment(MyTaskset(vf.TasksetConfig(id="mine")))
    trainer = MultiTurnGRPOTrainer(model=..., args=MultiTurnGRPOConfig(reward_mode="dense", ...),
                                   train_dataset=Dataset.from_list(rows), environment_factory=environment)
"""

from __future__ import annotations

import argparse
import functools
import inspect
import types
from contextlib import AsyncExitStack

from .runner import AgentEnvironment, AgentResult, AgentSession


def verifiers_environment(taskset, **kwargs) -> tuple[list[dict], AgentEnvironment]:
    """The rows (one per task of `taskset`, in its order: `{"verifiers_task": index, "prompt": text}`) and the
    `AgentEnvironment` that plays and scores them; `kwargs` go to `AgentEnvironment` (`agent_timeout`, ...)."""
    tasks = list(taskset)
    if not tasks:
        raise ValueError(f"the taskset {type(taskset).__name__} yields no task: give one with tasks (check its "
                         "load() and any include/take view)")

    async def play(row: dict, session: AgentSession) -> AgentResult:
        import openai
        from verifiers.v1.dialects.chat import parse_tools

        index = row.get("verifiers_task")
        if not isinstance(index, int) or not 0 <= index < len(tasks):
            raise ValueError(f"verifiers_task={index!r}: a row of verifiers_environment's rows names a task index "
                             f"in 0..{len(tasks) - 1}")
        task = tasks[index]
        sandboxed = [fn.__name__ for fn in task.hooks("reward") if _needs_runtime(fn)]
        if sandboxed:
            raise ValueError(f"the rubric's rewards {sandboxed} need a runtime (a sandbox), which this harness does "
                             "not start: verifiers would leave them out of the reward")
        program = chat_program()
        messages = _opening(task.data)
        opening = len(messages)
        async with AsyncExitStack() as stack:
            servers = {}
            for toolset in type(task).toolsets(task.config):
                await toolset.setup()
                await toolset.setup_task(task)
                servers[toolset.server_name] = _mcp_server(toolset)
            tools, dispatch, connections = await program.connect_mcp({"mcpServers": servers}, stack)
            client = session.async_openai()
            stack.push_async_callback(client.close)
            compactor = program.Compactor(client, session.model, tools, False, None)  # no compaction
            compactor.note_good(messages)
            loop_args = argparse.Namespace(tool_interception_url="", bash=False, edit=False, search=False)
            try:
                await program.run_chat_loop(loop_args, compactor, messages, dispatch, connections, None)
            except openai.BadRequestError:  # refused past max_turns (or the episode failed: no reward counts then)
                pass
            except SystemExit as exc:  # the program's exit on a connection error, which is no exit of the trainer's
                raise RuntimeError(f"verifiers' chat program lost the endpoint (exit {exc.code})") from exc
        trace = _trace(task, messages, opening, parse_tools(tools))
        await task.score(trace)
        skipped = [name for name, reward in trace.rewards.items() if reward is None]
        if skipped:
            raise ValueError(f"the rubric's rewards {skipped} did not score the episode")
        return AgentResult(reward=float(trace.reward),
                           info={"rewards": {name: r.score for name, r in trace.rewards.items()},
                                 "tool_calls": sum(m.get("role") == "tool" for m in messages[opening:])})

    rows = [{"verifiers_task": i, "prompt": task.data.prompt_text} for i, task in enumerate(tasks)]
    return rows, AgentEnvironment(play, **kwargs)


@functools.cache
def chat_program() -> types.ModuleType:
    """verifiers' chat program (the `null` harness's, the text it launches as a `uv` script) as a module, with its
    MCP connection class swapped for `InProcessConnection`."""
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE

    program = types.ModuleType("verifiers_chat_program")
    exec(compile(CHAT_PROGRAM_SOURCE, "<verifiers chat program>", "exec"), program.__dict__)  # not __main__: no run
    program.MCPConnection = InProcessConnection
    return program


class InProcessConnection:
    """The chat program's MCP connection (its `MCPConnection`'s `run`/`aclose`) to an MCP server in this process:
    each operation on a fresh in-memory `mcp.Client`, as the program reconnects per call over HTTP."""

    def __init__(self, server):
        self.server = server

    async def run(self, operation):
        from mcp import Client

        async with Client(self.server, raise_exceptions=False) as client:
            return await operation(client)

    async def aclose(self) -> None:
        pass


def _mcp_server(toolset):
    """The MCP server a toolset's own `register` builds (as verifiers' `ServerBase._serve` builds it, unserved)."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer(toolset.server_name or type(toolset).__name__)
    toolset.register(server)
    return server


def _needs_runtime(fn) -> bool:
    """verifiers' rule for a reward it skips without a runtime: a `runtime` parameter with no default."""
    parameter = inspect.signature(fn).parameters.get("runtime")
    return parameter is not None and parameter.default is inspect.Parameter.empty


def _opening(data) -> list[dict]:
    """A task's opening messages in OpenAI's form: its system prompt, then its prompt (a string or messages)."""
    messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        return [*messages, {"role": "user", "content": data.prompt}]
    return [*messages, *(m.model_dump(exclude_none=True) for m in data.prompt or [])]


def _trace(task, messages: list[dict], opening: int, tools):
    """The conversation as verifiers records it: a `Trace` whose nodes are the messages in order (the root carrying
    the tools), the model's replies (the assistant messages after the `opening` ones) marked sampled."""
    import verifiers.v1 as vf
    from verifiers.v1.dialects.chat import parse_message
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.trace import AgentInfo, TraceTask

    nodes = [MessageNode(parent=k - 1 if k else None, message=parse_message(m), tools=(tools or []) if k == 0 else [],
                         sampled=k >= opening and m.get("role") == "assistant") for k, m in enumerate(messages)]
    trace = vf.Trace(task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                     agent=AgentInfo(config=vf.AgentConfig()), nodes=nodes)
    trace.is_completed = trace.ok = True
    return trace
