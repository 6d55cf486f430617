"""Agents as environments: the user's agent function plays each episode against the chat endpoint.

`AgentRunner(rows) -> list[Episode]` has the call shape of `EpisodeRunner`. Per row it runs the agent function on a
thread of its own (an async function in its own event loop there), bound to a key of its own for the loopback chat
endpoint (`ChatEndpoint`), and the calling thread serves the model: it gathers the pending requests of every episode
into one `generate_fn` call (when every running episode has a request pending, or no request arrived for
`batch_wait` seconds), records each request's context ids, sampled ids and log-probs (`EpisodeRecord`), and answers
each request with OpenAI's response, tool calls parsed from the model's own output by TRL's `parse_response`.

Faults fail their episode and no other: the agent raising, returning what is not a reward, running past
`agent_timeout` (a hung client included: its request is answered when the episode fails), a malformed request
(answered 400). A request after its episode ended (a thread or process the agent left behind) is answered 410 and
changes nothing: the episode keeps the outcome it had when it ended. Nothing waits without a bound: the serving loop
wakes at the next deadline, and a request's thread waits at most until its episode's deadline. A thread whose agent
hangs in its own code cannot be killed (Python threads cannot); its episode fails at the deadline, its session's
`stop` event is set, and every request it makes later is refused. An agent in its own process (`AgentCommand`,
`process.py`) is killed with its process group when its episode fails (its deadline included) or when it exits.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence, Union

from ..rollout.episode import Episode
from ..rollout.formats import EpisodeFormat
from ..rollout.rules import EpisodeRules
from .endpoint import ChatEndpoint
from .protocol import ChatRequest, RequestError, chat_completion, error_body, read_request, reply_message
from .recording import Call, EpisodeRecord, Renderer

logger = logging.getLogger(__name__)


@dataclass
class AgentResult:
    """What an agent function may return instead of a bare reward.

    reward: the episode's final reward, added to its last model call's turn.
    won: the agent's own verdict of success (the success-rate metrics); never inferred from the reward.
    turn_rewards: optional per model call rewards (one per chat request the agent made), before `reward` is added.
    info: anything to keep with the episode (saved with `save_episodes`).
    """

    reward: float = 0.0
    won: bool = False
    turn_rewards: Sequence[float] | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AgentSession:
    """What an agent function is handed with its task row: the endpoint's base URL, the episode's API key and the
    model name to send. `openai()`, `async_openai()` and `anthropic()` build clients bound to them (no retries: a
    refused request is the episode's fault, not a transient one). `stop` is set when the episode fails (its deadline,
    a malformed request, the rollout stopping): an agent that can stop early (`AgentCommand` kills its process)
    watches it."""

    base_url: str
    api_key: str
    model: str
    timeout: float
    stop: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)

    def openai(self, **kwargs):
        from openai import OpenAI

        return OpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0, timeout=self.timeout, **kwargs)

    def async_openai(self, **kwargs):
        from openai import AsyncOpenAI

        return AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0, timeout=self.timeout,
                           **kwargs)

    def anthropic(self, **kwargs):
        """An `anthropic.Anthropic` client (its base URL is the server's root: it adds `/v1/messages` itself)."""
        from anthropic import Anthropic

        return Anthropic(base_url=self.base_url.removesuffix("/v1"), api_key=self.api_key, max_retries=0,
                         timeout=self.timeout, **kwargs)


AgentFn = Callable[[dict, AgentSession], Union[float, AgentResult, Awaitable[Union[float, AgentResult]]]]
GenerateFn = Callable[[list[list[int]], int], "tuple[list[list[int]], list[list[float]] | None]"]


@dataclass
class AgentEnvironment:
    """Pass as a trainer's `environment_factory` to train `agent` (see the module docstring and the README's "Train
    your existing agent").

    agent: `agent(task_row, session) -> reward | AgentResult`, sync or async.
    agent_timeout: seconds one episode's agent may run, model calls included, before its episode fails.
    batch_wait: the pause, in seconds, that ends the gathering of a generate call: the call goes when every
        running episode has a request pending, or when no new request has arrived for `batch_wait` seconds (the
        episodes still out are busy with their own work). Agents answered one after another send their next
        requests one after another, and a turn gathers them all however long that takes (at most `batch_wait` per
        episode). With a tiny model on 2 busy cores, 0.2 s gathered every turn whole at 16 and 64 episodes, 0.05 s
        did not (docs/agents.md).
    """

    agent: AgentFn
    agent_timeout: float = 600.0
    batch_wait: float = 0.2

    def __post_init__(self):
        if not callable(self.agent):
            raise ValueError(f"agent={self.agent!r}: pass a function (task_row, session) -> reward")
        if not self.agent_timeout > 0:
            raise ValueError(f"agent_timeout={self.agent_timeout}: give a positive number of seconds (e.g. 600)")
        if not self.batch_wait >= 0:
            raise ValueError(f"batch_wait={self.batch_wait}: give a number of seconds >= 0 (e.g. 0.2)")

    def runner(self, tokenizer, generate_fn: GenerateFn, args, reward_funcs: Sequence = (), **kwargs) -> AgentRunner:
        """The `AgentRunner` of a trainer config `args` (its rules' `max_turns`, `max_completion_length`,
        `max_episode_tokens`, `episode_format`); `kwargs` go to `AgentRunner`. The trainer's own `reward_funcs` are
        refused: an agent's episode is scored by the reward it returns, and one whose batch becomes step samples has
        no trajectory to score."""
        if reward_funcs:
            raise ValueError(f"reward_funcs={list(reward_funcs)!r} with an AgentEnvironment: the agent function's "
                             "return value is the episode's reward; compute any other score inside the agent and "
                             "drop reward_funcs")
        if getattr(args, "reward_mode", None) == "sparse":
            logger.warning("reward_mode='sparse' trains on the agents' `won` verdicts only (AgentResult.won), not on "
                           "the rewards they return: set reward_mode='dense' to train on those")
        return AgentRunner(self, tokenizer, generate_fn, args.episode_rules(), **kwargs)


@dataclass
class _Pending:
    slot: _Slot
    call: Call
    budget: int
    arrived: float
    done: threading.Event = field(default_factory=threading.Event)
    status: int = 0
    body: dict = field(default_factory=dict)

    def answer(self, status: int, body: dict) -> None:
        self.status, self.body = status, body
        self.done.set()


@dataclass
class _Slot:
    """One episode of a rollout: its agent's thread, its record and how it ended."""

    record: EpisodeRecord
    deadline: float
    running: bool = True
    result: AgentResult | None = None
    failure: str | None = None
    truncated: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)  # orders this episode's recorded calls
    cancel: Callable[[], None] | None = None
    stop: threading.Event = field(default_factory=threading.Event)  # the session's: set when the episode fails


class AgentRunner:
    """Plays one agent episode per dataset row through the chat endpoint (see the module docstring).

    Args:
        environment: the `AgentEnvironment` (agent function, timeout, batch wait).
        tokenizer: the policy's tokenizer and chat template.
        generate_fn: `(contexts, max_new_tokens) -> (completions, logprobs | None)`, the trainer's.
        rules: the rules of play (`EpisodeRules`) an agent's episode keeps: `max_turns`, the most model calls per
            episode (a request past it is refused (400) and the episode is truncated; it keeps its reward if the
            agent still returns one); `max_completion_length`, the cap on one reply (a request's `max_tokens` may
            lower it); `max_episode_tokens`, the cap on one call's context plus its reply (a request with no room
            left is refused like one past `max_turns`); `episode_format`, "trajectory" (an episode whose requests
            all joined is one sample; when any episode of the rollout started a new sample, every episode of that
            rollout is returned as step samples) or "stepwise" (every model call is a step sample). The agent
            writes its own messages: the other rules (system prompt, action parser, history) are not applied.
        eos_token_ids / chat_template_kwargs: as the trainer's.
        any_live: on several processes, `(local live count) -> bool` True while any rank has a live episode; every
            rank then makes the same generate calls (one with no context where it has none pending).
    """

    def __init__(self, environment: AgentEnvironment, tokenizer, generate_fn: GenerateFn, rules: EpisodeRules, *,
                 eos_token_ids: Sequence[int] | None = None, chat_template_kwargs: dict | None = None,
                 any_live: Callable[[int], bool] | None = None, model_name: str = "policy"):
        self.environment = environment
        self.tokenizer = tokenizer
        self.generate_fn = generate_fn
        self.rules = rules
        self.format = rules.episode_format_strategy()
        eos = list(eos_token_ids) if eos_token_ids is not None else [tokenizer.eos_token_id]
        self.renderer = Renderer(tokenizer, eos, chat_template_kwargs)
        self.any_live = any_live
        self.model_name = model_name
        self.endpoint: ChatEndpoint | None = None
        self.last_stats: dict[str, int] = {}
        self._cond = threading.Condition()
        self._slots: dict[str, _Slot] = {}
        self._queue: list[_Pending] = []
        self._parses_tools: bool | None = None  # decided on the first request with tools

    # -- the rollout (the calling thread) -----------------------------------------------------------------------

    def __call__(self, rows: list[dict]) -> list[Episode]:
        if self.endpoint is None:
            self.endpoint = ChatEndpoint(self._serve, self.model_name)
        timeout = self.environment.agent_timeout
        ids = [secrets.token_hex(8) for _ in rows]
        with self._cond:
            start = time.monotonic()
            self._slots = {i: _Slot(EpisodeRecord(row), start + timeout) for i, row in zip(ids, rows)}
            self._queue = []
        slots = [self._slots[i] for i in ids]
        try:
            for i, slot in zip(ids, slots):
                self._start_agent(slot, AgentSession(self.endpoint.base_url, self.endpoint.key(i), self.model_name,
                                                     timeout, slot.stop))
            self._serve_model()
        finally:
            with self._cond:  # every request from now on is refused; a request still waiting is answered
                for slot in slots:
                    self._fail(slot, "the rollout stopped before the agent returned")
                self._slots = {}
                self.endpoint.forget(ids)
                for pending in self._queue:
                    pending.answer(410, error_body("the rollout ended", 410))
                self._queue = []
        return self._episodes(slots)

    def played_format(self, episodes: list[Episode]) -> EpisodeFormat:
        """The format `episodes` (this runner's) were played in, which their training rows follow: the rules' own,
        or the step-wise one where `_episodes` returned a rollout as step samples (the one place that decides it)."""
        return self.format.as_played(any(ep.step_contexts for ep in episodes))

    def close(self) -> None:
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None

    def _serve_model(self) -> None:
        while True:
            with self._cond:
                batch = self._gather()
                live = sum(s.running for s in self._slots.values())
            if self.any_live is not None:
                if not self.any_live(live + len(batch)):
                    return
            elif not batch and not live:
                return
            contexts = [p.call.context for p in batch]
            if not contexts and self.any_live is None:
                continue
            try:
                completions, logprobs = self.generate_fn(contexts, max((p.budget for p in batch), default=1))
            except BaseException:
                for pending in batch:
                    pending.answer(410, error_body("the trainer's generation failed; the rollout stops", 410))
                raise
            for j, pending in enumerate(batch):
                ids = list(completions[j][: pending.budget])
                lps = list(logprobs[j][: pending.budget]) if logprobs is not None else [math.nan] * len(ids)
                self._answer(pending, ids, lps)

    def _gather(self) -> list[_Pending]:
        """Under the lock: wait until the pending requests make a batch (every running episode has one, or none
        arrived for `batch_wait` seconds), or nothing runs; fail episodes past their deadline meanwhile. With
        `any_live`, return at the latest `batch_wait` after the call (a rank takes part in every generate call)."""
        wait = self.environment.batch_wait
        called = time.monotonic()
        while True:
            now = time.monotonic()
            for slot in self._slots.values():
                if slot.running and now >= slot.deadline:
                    self._fail(slot, f"the agent ran past agent_timeout={self.environment.agent_timeout}s")
            running = [s for s in self._slots.values() if s.running]
            queue = [p for p in self._queue if p.slot.running]
            waiting = {id(p.slot) for p in queue}
            if not running or (queue and (len(waiting) >= len(running) or now >= queue[-1].arrived + wait)):
                self._queue = []
                return queue
            if self.any_live is not None and now >= called + wait:
                self._queue = []
                return queue
            wake = [min(s.deadline for s in running)]
            if queue:
                wake.append(queue[-1].arrived + wait)
            if self.any_live is not None:
                wake.append(called + wait)
            self._cond.wait(max(0.0, min(wake) - now))

    def _answer(self, pending: _Pending, ids: list[int], logprobs: list[float]) -> None:
        call = pending.call
        call.sampled, call.logprobs = ids, logprobs
        parsed = self._parse(call)
        call.reply = reply_message(parsed)
        call.text = call.reply["content"]
        closed = bool(ids) and ids[-1] in self.renderer.eos_token_ids
        pending.answer(200, chat_completion(call.reply, call.request.model or self.model_name,
                                            "stop" if closed else "length", len(call.context), len(ids)))

    def _parse(self, call: Call) -> dict:
        """The reply as an assistant message: with tools, TRL's `parse_response` on the sampled ids (tool calls
        out of the model's own template syntax); without, or for a template TRL has no response parser for (warned
        once), the decoded text."""
        if call.request.tools and self._tool_parser():
            from trl.chat_template_utils import parse_response

            return parse_response(self.tokenizer, call.sampled, prefix=call.context, tools=call.request.tools)
        return {"role": "assistant", "content": self.tokenizer.decode(call.sampled, skip_special_tokens=True)}

    def _tool_parser(self) -> bool:
        """Whether the tokenizer parses tool calls (given TRL's response schema on first use, as GRPO does)."""
        if self._parses_tools is None:
            from trl.chat_template_utils import add_response_schema

            self._parses_tools = True
            if getattr(self.tokenizer, "response_template", None) is None and getattr(
                    self.tokenizer, "response_schema", None) is None:
                try:
                    add_response_schema(self.tokenizer)
                except ValueError as exc:
                    self._parses_tools = False
                    logger.warning("agents' requests carry tools, but the policy's chat template has no response "
                                   "parser (%s): replies come back as text, without tool_calls. Set the tokenizer's "
                                   "response_schema, or use a template TRL knows (Qwen2.5/3, Llama 3.1/3.2, ...)",
                                   str(exc).split(".")[0])
        return self._parses_tools

    # -- the agents' threads -------------------------------------------------------------------------------------

    def _start_agent(self, slot: _Slot, session: AgentSession) -> None:
        agent = self.environment.agent

        def run():
            try:
                result = agent(slot.record.task, session)
                if inspect.isawaitable(result):  # an async agent: its own event loop, on this thread
                    result = self._run_async(slot, result)
                outcome, failure = _checked_result(result), None
            except BaseException as exc:  # noqa: BLE001 - whatever the agent raises fails its episode only
                outcome, failure = None, f"the agent raised {type(exc).__name__}: {exc}"
            with slot.lock:  # a request of this episode is recorded and queued wholly before this, or refused after
                self._finish(slot, outcome, failure)

        threading.Thread(target=run, name="agent-episode", daemon=True).start()

    def _run_async(self, slot: _Slot, awaitable):
        loop = asyncio.new_event_loop()
        try:
            task = asyncio.ensure_future(awaitable, loop=loop)
            slot.cancel = lambda: loop.call_soon_threadsafe(task.cancel)
            return loop.run_until_complete(task)
        finally:
            slot.cancel = None  # under no lock: a cancel racing this sees a closed loop, which `_fail` ignores
            try:  # as asyncio.run does: the agent's unfinished async generators (a stream it left) are closed
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    def _finish(self, slot: _Slot, outcome: AgentResult | None, failure: str | None) -> None:
        with self._cond:
            if not slot.running:
                return  # failed already (deadline, malformed request, rollout stopped)
            if failure is None and not slot.record.calls:
                failure = "the agent returned without calling the model"
            if failure is None and outcome.turn_rewards is not None and len(outcome.turn_rewards) != len(
                    slot.record.calls):
                failure = (f"the agent returned {len(outcome.turn_rewards)} turn_rewards for "
                           f"{len(slot.record.calls)} model calls: give one per call")
            if failure is None and any(p.slot is slot for p in self._queue):
                failure = "the agent returned while a request of its own was still waiting for the model"
            if failure is not None:
                self._fail(slot, failure)
                return
            slot.running, slot.result = False, outcome
            self._cond.notify_all()

    def _fail(self, slot: _Slot, reason: str) -> None:
        """Under the lock: end `slot`'s episode as failed, answer its pending requests and stop its agent."""
        if not slot.running:
            return
        slot.running, slot.failure = False, reason
        slot.stop.set()
        for pending in [p for p in self._queue if p.slot is slot]:
            pending.answer(410, error_body(f"this episode failed: {reason}", 410))
        self._queue = [p for p in self._queue if p.slot is not slot]
        self._cond.notify_all()
        cancel = slot.cancel
        if cancel is not None:
            try:
                cancel()
            except RuntimeError:  # its event loop closed meanwhile: the agent has returned
                pass

    # -- the endpoint's request threads --------------------------------------------------------------------------

    def _serve(self, episode: str, body: object) -> tuple[int, dict]:
        with self._cond:
            slot = self._slots.get(episode)
            if slot is None:
                return 410, error_body("no episode of the rollout under way has this key (it ended)", 410)
            if not slot.running:  # a thread or process the agent left behind: refused, the outcome stays as it was
                return 410, error_body("this episode is over: its agent has returned or it failed", 410)
        with slot.lock:
            try:
                if isinstance(body, RequestError):
                    raise body
                pending = self._pending(slot, read_request(body))
            except RequestError as exc:
                with self._cond:
                    if exc.status == 400 and not slot.truncated:
                        self._fail(slot, f"a malformed request: {exc}")
                return exc.status, error_body(str(exc), exc.status)
        if pending.done.wait(max(0.0, slot.deadline - time.monotonic()) + 60.0):
            return pending.status, pending.body
        return 410, error_body("the request was not served before its episode's deadline", 410)

    def _pending(self, slot: _Slot, request: ChatRequest) -> _Pending:
        record = slot.record
        if len(record.calls) >= self.rules.max_turns:
            slot.truncated = True
            raise RequestError(f"this episode's turn budget is spent (max_turns={self.rules.max_turns})", 400)
        call = record.context_for(request, self.renderer)
        budget = min(request.max_tokens or self.rules.max_completion_length, self.rules.max_completion_length)
        if self.rules.max_episode_tokens is not None:
            budget = min(budget, self.rules.max_episode_tokens - len(call.context))
        if budget < 1:
            record.calls.pop()
            slot.truncated = True
            raise RequestError(f"the context of {len(call.context)} tokens leaves no room for a reply within "
                               f"max_episode_tokens={self.rules.max_episode_tokens}", 400)
        pending = _Pending(slot, call, budget, time.monotonic())
        with self._cond:
            if not slot.running:
                record.calls.pop()
                raise RequestError(f"this episode is over: {slot.failure}", 410)
            self._queue.append(pending)
            self._cond.notify_all()
        return pending

    # -- episodes --------------------------------------------------------------------------------------------------

    def _episodes(self, slots: list[_Slot]) -> list[Episode]:
        done = [s for s in slots if s.failure is None]
        joined = sum(s.record.joined for s in done)
        samples = sum(s.record.samples for s in done)
        # an agent whose template or framework rewrote its history gives step samples in either format: every
        # episode of the rollout then is, so that its rows follow one layout (`played_format` reads it back)
        episode_format = self.format.as_played(any(s.record.samples > 1 for s in done))
        self.last_stats = {"joined": joined, "new_samples": samples, "failed": len(slots) - len(done),
                           "stepwise": int(episode_format.name == "stepwise")}
        logger.info("agent rollout: %d model calls joined their episode's sample, %d started a sample; %d of %d "
                    "episodes failed; %s format", joined, samples, len(slots) - len(done), len(slots),
                    episode_format.label)
        out = []
        for slot in slots:
            record = slot.record
            if slot.failure is not None:
                failed = Episode(task=record.task, prompt_ids=[], prompt_messages=[])
                failed.fail(slot.failure)
                out.append(failed)
                continue
            result = slot.result
            rewards = [float(r) for r in result.turn_rewards] if result.turn_rewards is not None else [0.0] * len(
                record.calls)
            rewards[-1] += float(result.reward)
            ep = episode_format.agent_episode(record, rewards, bool(result.won), slot.truncated)
            if result.info:
                ep.turns[-1].info = {**ep.turns[-1].info, **result.info}
            out.append(ep)
        return out


def _checked_result(result) -> AgentResult:
    """An agent's return value as an `AgentResult`; a value that is no finite reward raises (failing the episode:
    an infrastructure failure is never a reward)."""
    if not isinstance(result, AgentResult):
        if isinstance(result, bool) or not isinstance(result, (int, float)):
            raise TypeError(f"the agent returned {type(result).__name__} {result!r}: return a float reward or an "
                            "AgentResult")
        result = AgentResult(reward=float(result))
    values = [result.reward, *(result.turn_rewards or [])]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        raise ValueError(f"the agent's rewards {values!r} are not all finite numbers")
    return result
