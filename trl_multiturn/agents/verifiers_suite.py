"""verifiers' environments (verifiers 0.4, `verifiers.v1`) trained through the chat endpoint, their rubric as the
reward.

A verifiers environment is a taskset (its tasks: a prompt, an optional system prompt, and the task's `@vf.reward`
functions, its rubric) played by a harness (an agent program verifiers launches in a runtime, whose model calls its
interception server forwards to the model). Here the taskset is verifiers' own object, used as it is, and the harness
is a chat client of the training endpoint: each episode sends the task's system prompt and prompt to the policy and
takes its reply (verifiers' plain chat harness, without tools), records the exchange as a verifiers `Trace`, and
scores it with verifiers' own `task.score(trace)`: the weighted sum of the task's rewards is the episode's reward.
A rubric that raises fails its episode, and so does one whose reward did not run (verifiers skips a reward that
needs a runtime, a sandbox this harness does not start, and records None): a reward left out is no reward of 0.

    rows, environment = verifiers_environment(MyTaskset(vf.TasksetConfig(id="mine")))
    trainer = MultiTurnGRPOTrainer(model=..., args=MultiTurnGRPOConfig(reward_mode="dense", ...),
                                   train_dataset=Dataset.from_list(rows), environment_factory=environment)
"""

from __future__ import annotations

import inspect

from .runner import AgentEnvironment, AgentResult, AgentSession


def verifiers_environment(taskset, **kwargs) -> tuple[list[dict], AgentEnvironment]:
    """The rows (one per task of `taskset`, in its order: `{"verifiers_task": index, "prompt": text}`) and the
    `AgentEnvironment` that plays and scores them; `kwargs` go to `AgentEnvironment` (`agent_timeout`, ...)."""
    tasks = list(taskset)
    if not tasks:
        raise ValueError(f"the taskset {type(taskset).__name__} yields no task: give one with tasks (check its "
                         "load() and any include/take view)")

    async def play(row: dict, session: AgentSession) -> AgentResult:
        index = row.get("verifiers_task")
        if not isinstance(index, int) or not 0 <= index < len(tasks):
            raise ValueError(f"verifiers_task={index!r}: a row of verifiers_environment's rows names a task index "
                             f"in 0..{len(tasks) - 1}")
        task = tasks[index]
        sandboxed = [fn.__name__ for fn in task.hooks("reward") if _needs_runtime(fn)]
        if sandboxed:
            raise ValueError(f"the rubric's rewards {sandboxed} need a runtime (a sandbox), which this harness does "
                             "not start: verifiers would leave them out of the reward")
        messages = _opening(task.data)
        client = session.async_openai()
        try:
            reply = await client.chat.completions.create(model=session.model, messages=messages)
        finally:
            await client.close()
        trace = _trace(task, messages, reply.choices[0].message.content or "", reply.choices[0].finish_reason)
        await task.score(trace)
        skipped = [name for name, reward in trace.rewards.items() if reward is None]
        if skipped:
            raise ValueError(f"the rubric's rewards {skipped} did not score the episode")
        return AgentResult(reward=float(trace.reward),
                           info={"rewards": {name: r.score for name, r in trace.rewards.items()}})

    rows = [{"verifiers_task": i, "prompt": task.data.prompt_text} for i, task in enumerate(tasks)]
    return rows, AgentEnvironment(play, **kwargs)


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


def _trace(task, messages: list[dict], reply: str, finish_reason: str | None):
    """The exchange as verifiers records it: a `Trace` whose nodes are the opening messages and the sampled reply."""
    import verifiers.v1 as vf
    from pydantic import TypeAdapter
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.trace import AgentInfo, TraceTask
    from verifiers.v1.types import AssistantMessage, Message

    opening = TypeAdapter(list[Message]).validate_python(messages)
    nodes = [MessageNode(parent=k - 1 if k else None, message=m) for k, m in enumerate(opening)]
    nodes.append(MessageNode(parent=len(nodes) - 1, message=AssistantMessage(content=reply), sampled=True))
    trace = vf.Trace(task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                     agent=AgentInfo(config=vf.AgentConfig()), nodes=nodes)
    trace.stop_condition = "max_output_tokens" if finish_reason == "length" else None
    trace.is_completed = trace.ok = True
    return trace
