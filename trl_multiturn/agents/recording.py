"""Token recording of one agent episode: each request's context ids, the ids sampled for it and their log-probs,
and the `Episode` they make.

A request joins the episode's trajectory when its messages are the previous request's messages, then the reply the
endpoint returned, then new messages, with the same tools, and the chat template renders such a conversation by
appending only (the assistant turn extends the previous generation prompt, and the new messages extend the closed
assistant turn). Its context is then the previous context, the reply's ids exactly as sampled (closed with the
end-of-turn token where the reply was cut), and the template's tokens for the new messages: no sampled id is ever
decoded and re-encoded. Otherwise (the agent truncated, summarised or rewrote its history, changed its tools, or the
template rewrites earlier turns) the request's context is the template's rendering of its messages, and a new sample
starts.

An episode whose requests all joined is one trajectory sample (`Episode` in the trajectory format: sampled tokens
under mask 1, the template's tokens for the agent's messages under mask 0). Otherwise each request is a step sample
(`Episode.step_contexts`), all of one episode, so the credit gives them that episode's advantages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..rollout.episode import Episode, Turn
from .protocol import ChatRequest, RequestError, same_reply


@dataclass
class Call:
    """One model call of an episode: the request, the context ids it was generated from, the reply as sampled."""

    request: ChatRequest
    context: list[int]
    joined: bool
    rendered_prompt: list[int]
    sampled: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    reply: dict | None = None  # the assistant message returned (`protocol.reply_message`)
    text: str = ""


class Renderer:
    """The chat template's token renderings of a request's messages (its tools included). A request with tools is
    refused (`RequestError`, 400) where the template renders the same tokens without them: the model would never see
    the tools (SmolLM2's template, for one, drops them)."""

    def __init__(self, tokenizer, eos_token_ids, chat_template_kwargs: dict | None = None):
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)
        self.kwargs = dict(chat_template_kwargs or {})
        self._drops_tools: bool | None = None  # decided on the first request with tools

    def check_tools(self, request: ChatRequest, rendered: list[int]) -> None:
        """Refuse `request` (rendered as `rendered`) where the template dropped its tools."""
        if not request.tools:
            return
        if self._drops_tools is None:
            self._drops_tools = rendered == self.render(request.messages, None, add_generation_prompt=True)
        if self._drops_tools:
            raise RequestError(
                f"the request sends tools, but the policy's chat template ({self.tokenizer.name_or_path}) drops "
                "`tools`: the model would never see them. Set the trainer's chat_template_path to a template that "
                "renders tools (for a ChatML model, TRL's trl/chat_templates/qwen2_5.jinja; the offline default "
                "model has one), or send no tools", 400)

    def render(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool) -> list[int]:
        out = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                                 tokenize=True, return_dict=True, **self.kwargs)
        return list(out["input_ids"])

    def joined_context(self, previous: Call, request: ChatRequest) -> list[int] | None:
        """The context of `request` as the continuation of `previous` (see the module docstring), or None where
        it does not join (`previous` not answered yet included)."""
        before = previous.request
        n = len(before.messages)
        messages = request.messages
        if (previous.reply is None or request.tools != before.tools or len(messages) <= n + 1
                or messages[:n] != before.messages or not same_reply(messages[n], previous.reply)):
            return None
        closed = self.render(messages[: n + 1], request.tools, add_generation_prompt=False)
        full = self.render(messages, request.tools, add_generation_prompt=True)
        prompt = previous.rendered_prompt
        if closed[: len(prompt)] != prompt or full[: len(closed)] != closed:
            return None  # the template rewrites earlier turns
        end = max((i for i in range(len(prompt), len(closed)) if closed[i] in self.eos_token_ids), default=None)
        if end is None:
            return None  # no end-of-turn token closes the assistant turn: no place to join the sampled reply
        sampled = previous.sampled
        close = [] if sampled and sampled[-1] in self.eos_token_ids else [closed[end]]
        return previous.context + sampled + close + closed[end + 1:] + full[len(closed):]


class EpisodeRecord:
    """The calls of one episode, in order, and the `Episode` they make."""

    def __init__(self, task: dict):
        self.task = task
        self.calls: list[Call] = []

    def context_for(self, request: ChatRequest, renderer: Renderer) -> Call:
        """The call `request` makes: joined to the previous call where it continues it, else rendered whole."""
        full = renderer.render(request.messages, request.tools, add_generation_prompt=True)
        renderer.check_tools(request, full)
        joined = renderer.joined_context(self.calls[-1], request) if self.calls else None
        call = Call(request, joined if joined is not None else full, joined is not None, full)
        self.calls.append(call)
        return call

    @property
    def joined(self) -> int:
        return sum(c.joined for c in self.calls)

    @property
    def samples(self) -> int:
        """The number of training samples the calls make: one per call that did not join."""
        return sum(not c.joined for c in self.calls)

    def episode(self, turn_rewards: list[float], won: bool, truncated: bool) -> Episode:
        """The trajectory-format `Episode` of a one-sample record (`samples == 1`); see `stepwise_episode`."""
        first = self.calls[0]
        ep = self._base(first.context)
        for k, call in enumerate(self.calls):
            if k > 0:  # the template's tokens for the agent's messages after the previous reply
                delta = call.context[len(first.context) + len(ep.completion_ids):]
                ep.completion_ids += delta
                ep.env_mask += [0] * len(delta)
                ep.logprobs += [math.nan] * len(delta)
            self._append_turn(ep, k, turn_rewards, context=None)
        return _ended(ep, won, truncated)

    def stepwise_episode(self, turn_rewards: list[float], won: bool, truncated: bool) -> Episode:
        """Every call as a step sample: its context exactly as generated from, its reply as sampled."""
        ep = self._base(self.calls[0].context)
        for k, call in enumerate(self.calls):
            self._append_turn(ep, k, turn_rewards, context=call.context)
        return _ended(ep, won, truncated)

    def _base(self, prompt_ids: list[int]) -> Episode:
        return Episode(task=self.task, prompt_ids=list(prompt_ids),
                       prompt_messages=list(self.calls[0].request.messages))

    def _append_turn(self, ep: Episode, k: int, turn_rewards: list[float], context: list[int] | None) -> None:
        """Append call k's reply, as sampled, to `ep` as its turn k (mask 1, the sampling log-probs), answered by the
        messages the agent sent next (none after its last call)."""
        calls, call = self.calls, self.calls[k]
        start = len(ep.completion_ids)
        ep.completion_ids += call.sampled
        ep.env_mask += [1] * len(call.sampled)
        ep.logprobs += call.logprobs
        answered = k + 1 < len(calls)
        ep.turns.append(Turn(reply=call.text, action=call.text, span=(start, len(ep.completion_ids)),
                             reward=turn_rewards[k] if k < len(turn_rewards) else 0.0,
                             observation=_new_messages_text(call, calls[k + 1]) if answered else None,
                             role=_new_messages_role(calls[k + 1]) if answered else "user",
                             info={"joined": call.joined}, context=context))


def _ended(ep: Episode, won: bool, truncated: bool) -> Episode:
    """`ep` ended by the agent (won or not) or cut by the turn budget (`truncated`, the agent's verdict kept)."""
    if truncated:
        ep.truncate()
        ep.score_truncated(won)
    else:
        ep.end(won)
    return ep


def _new_messages_text(previous: Call, call: Call) -> str:
    """What the agent sent after a reply, as one text (for logs and anchor-state credit): the messages after the
    reply where the call joined, else its last message."""
    after = len(previous.request.messages) + 1
    messages = call.request.messages[after:] if call.joined else call.request.messages[-1:]
    return "\n".join(m["content"] for m in messages)


def _new_messages_role(call: Call) -> str:
    return call.request.messages[-1]["role"]
