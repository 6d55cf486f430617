"""OpenAI's chat-completions shapes: a request read into what the chat template renders, a reply written back.

`read_request` checks a `/v1/chat/completions` body and returns a `ChatRequest` whose messages are in the form
`apply_chat_template` takes (text content, tool-call arguments as objects); anything else raises `RequestError`
naming the field, the value and what to send instead. `chat_completion` writes the response body, the tool calls
in OpenAI's form (`{"id", "type": "function", "function": {"name", "arguments": "<json>"}}`).

Sampling settings in the request (`temperature`, `top_p`, `stop`, ...) are not applied: the policy samples with the
trainer's settings, which are the ones the log-probs and the loss assume. `n` other than 1 is refused. Streaming and
the other dialects are translations to and from these shapes (`dialects.py`).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

ROLES = ("system", "developer", "user", "assistant", "tool")
REFUSED = {"n": 1}  # field -> the only value served


class RequestError(ValueError):
    """A request the endpoint cannot serve; `status` is the HTTP status it is answered with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ChatRequest:
    """One chat request, normalised: `messages` as the chat template takes them, `tools` in OpenAI's function form
    (which `apply_chat_template` also takes), `max_tokens` the reply cap asked for (None: the trainer's)."""

    model: str
    messages: list[dict]
    tools: list[dict] | None
    max_tokens: int | None


def read_request(body: object) -> ChatRequest:
    """Check and normalise a decoded request body (see the module docstring)."""
    if not isinstance(body, dict):
        raise RequestError(f"the request body is a {type(body).__name__}: send a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(f"messages={_short(messages)}: send a non-empty list of chat messages")
    for name, served in REFUSED.items():
        if name in body and body[name] not in (None, served):
            raise RequestError(f"{name}={_short(body[name])} is not supported by the training endpoint: leave it out "
                               f"or send {json.dumps(served)}")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise RequestError(f"max_tokens={_short(max_tokens)}: send a positive integer, or leave it out")
    tools = body.get("tools") or None
    if tools is not None:
        tools = [_tool(k, t) for k, t in enumerate(tools)] if isinstance(tools, list) else _fail(
            f"tools={_short(tools)}: send a list of {{'type': 'function', 'function': {{...}}}} objects")
    model = body.get("model", "")
    return ChatRequest(model=str(model), messages=[_message(k, m) for k, m in enumerate(messages)], tools=tools,
                       max_tokens=max_tokens)


def _fail(message: str):
    raise RequestError(message)


def _short(value: object) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _tool(k: int, tool: object) -> dict:
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or tool.get("type", "function") != "function":
        raise RequestError(f"tools[{k}]={_short(tool)}: send {{'type': 'function', 'function': {{'name': ..., "
                           "'description': ..., 'parameters': {...}}}")
    return {"type": "function", "function": fn}


def _text(k: int, content: object) -> str:
    """A message's content as text: a string, None, or a list of text parts (`{"type": "text", "text": ...}`)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise RequestError(f"messages[{k}].content={_short(content)}: send a string or a list of text parts "
                       "(the policy reads text only)")


def _message(k: int, message: object) -> dict:
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        role = message.get("role") if isinstance(message, dict) else message
        raise RequestError(f"messages[{k}].role={_short(role)}: send one of {ROLES}")
    role = "system" if message["role"] == "developer" else message["role"]
    out = {"role": role, "content": _text(k, message.get("content"))}
    if role == "assistant" and message.get("tool_calls"):
        calls = message["tool_calls"]
        if not isinstance(calls, list):
            raise RequestError(f"messages[{k}].tool_calls={_short(calls)}: send a list of tool calls")
        out["tool_calls"] = [_tool_call(k, j, call) for j, call in enumerate(calls)]
    if role == "tool":
        for key in ("tool_call_id", "name"):
            if isinstance(message.get(key), str):
                out[key] = message[key]
    return out


def _tool_call(k: int, j: int, call: object) -> dict:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise RequestError(f"messages[{k}].tool_calls[{j}]={_short(call)}: send {{'id': ..., 'type': 'function', "
                           "'function': {'name': ..., 'arguments': '<json>'}}")
    arguments = fn.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            raise RequestError(f"messages[{k}].tool_calls[{j}].function.arguments={_short(arguments)} is not "
                               "JSON: send the arguments the endpoint returned") from None
    out = {"type": "function", "function": {"name": fn["name"], "arguments": arguments}}
    if isinstance(call.get("id"), str):
        out["id"] = call["id"]
    return out


def same_reply(sent: dict, returned: dict) -> bool:
    """Whether an assistant message of a request is the reply the endpoint returned: the same text and the same
    tool calls (names and arguments; the calls' ids are the client's to keep or drop)."""
    def calls(m):
        return [(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or []]
    return (sent.get("role") == "assistant" and sent["content"] == returned["content"]
            and calls(sent) == calls(returned))


def reply_message(parsed: dict) -> dict:
    """The assistant message of a parsed reply (TRL's `parse_response` form), normalised as `read_request` does:
    the form a request that sends the reply back is compared with."""
    out = {"role": "assistant", "content": parsed.get("content") or ""}
    calls = [c for c in parsed.get("tool_calls") or [] if isinstance(c, dict) and isinstance(c.get("function"), dict)]
    if calls:
        out["tool_calls"] = [{"type": "function", "function": {"name": c["function"]["name"],
                                                               "arguments": c["function"].get("arguments") or {}}}
                             for c in calls]
    return out


def chat_completion(message: dict, model: str, finish_reason: str, prompt_tokens: int,
                    completion_tokens: int) -> dict:
    """The response body for one reply (`message` as `reply_message` makes it)."""
    out: dict = {"role": "assistant", "content": message["content"]}
    if message.get("tool_calls"):
        out["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                              "function": {"name": c["function"]["name"],
                                           "arguments": json.dumps(c["function"]["arguments"])}}
                             for c in message["tool_calls"]]
        finish_reason = "tool_calls" if finish_reason == "stop" else finish_reason
        out["content"] = message["content"] or None
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": out, "finish_reason": finish_reason, "logprobs": None}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def error_body(message: str, status: int) -> dict:
    kind = {401: "authentication_error", 404: "not_found_error"}.get(status, "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}
