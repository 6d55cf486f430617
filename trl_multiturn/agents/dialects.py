"""The three API dialects the endpoint speaks, as translations to and from OpenAI's chat completions.

Every request, whatever its dialect, is translated into a chat-completions body (`protocol.read_request` then reads
it, and the runner records it, one path for all), and the chat completion the runner answers with is translated back
into the dialect's reply: a JSON body, or the dialect's server-sent events where the request asked to stream.

* `ChatCompletions` (`POST /v1/chat/completions`): the body as is; `stream=True` answers `chat.completion.chunk`
  events (the role, the content in pieces, each tool call's id and name then its arguments in pieces, the finish
  reason), the usage in a last chunk where `stream_options.include_usage` asks, then `data: [DONE]`.
* `Responses` (`POST /v1/responses`, OpenAI's Responses API): `instructions` and `input` items (messages, their
  `input_text`/`output_text` parts, `function_call` and `function_call_output` items) become chat messages, a
  `function_call` item joining the assistant message before it; `previous_response_id` prepends the conversation of
  that response (its input and output, without its instructions, as the API does), kept per episode by the
  endpoint; the reply is a `response` whose output is a `message` item and a `function_call` item per tool call.
* `Messages` (`POST /v1/messages`, Anthropic's Messages API): `system`, and content blocks (`text`, `tool_use`,
  `tool_result`) become chat messages (a `tool_result` a tool message); the reply is a `message` with a `text`
  block and a `tool_use` block per tool call.

Streams are written once the reply is generated (the policy generates whole replies in shared batches): the events
are the API's, in its order, and arrive together. Errors are answered in the dialect's error shape, before any event.
A request naming another model than the endpoint's is answered 404, as the APIs answer an unknown model.
"""

from __future__ import annotations

import json
import re
import time
import uuid

from .protocol import RequestError, _short, error_body

Events = list[tuple[str | None, dict]]  # (SSE event name or None, data)


def _pieces(text: str) -> list[str]:
    """`text` in word-sized pieces whose concatenation is `text` (the deltas of a stream)."""
    return [p for p in re.split(r"(?<=\s)(?=\S)", text) if p]


def _uid(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def _check_model(model: object, served: str) -> None:
    if not isinstance(model, str) or not model:
        raise RequestError(f"model={_short(model)}: send model={served!r}")
    if model != served:
        raise RequestError(f"the model {model!r} does not exist on this endpoint: send model={served!r}", 404)


def _stream_flag(body: dict) -> bool:
    stream = body.get("stream", False)
    if stream not in (True, False, None):
        raise RequestError(f"stream={_short(stream)}: send true or false")
    return bool(stream)


def _body(raw: object) -> dict:
    if not isinstance(raw, dict):
        raise RequestError(f"the request body is a {type(raw).__name__}: send a JSON object")
    return raw


def _function_tools(tools: object, function, sent: str) -> list[dict]:
    """`tools` in chat-completions form: `function(tool)` is a tool's function object, or None for a tool the
    training endpoint cannot serve (only the agent's own functions can be called by the policy); `sent` is the form
    to ask for."""
    if not isinstance(tools, list):
        raise RequestError(f"tools={_short(tools)}: send a list of {sent} tools")
    out = []
    for k, tool in enumerate(tools):
        fn = function(tool) if isinstance(tool, dict) else None
        if fn is None:
            raise RequestError(f"tools[{k}]={_short(tool)}: the training endpoint serves the agent's function tools "
                               f"only: send {sent}")
        out.append({"type": "function", "function": fn})
    return out


def _message_of(completion: dict) -> tuple[dict, str]:
    choice = completion["choices"][0]
    return choice["message"], choice["finish_reason"]


class ChatCompletions:
    """OpenAI's chat completions (see the module docstring)."""

    path = "/v1/chat/completions"

    def __init__(self, raw: object, model: str, history: dict):
        body = _body(raw)
        _check_model(body.get("model"), model)
        self.stream = _stream_flag(body)
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise RequestError(f"stream_options={_short(options)}: send an object such as {{'include_usage': true}}")
        self.include_usage = bool(options.get("include_usage"))
        self.chat_body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}

    @staticmethod
    def error(status: int, message: str) -> dict:
        return error_body(message, status)

    def reply(self, completion: dict) -> dict:
        return completion

    def events(self, completion: dict) -> Events:
        message, finish = _message_of(completion)
        head = {k: completion[k] for k in ("id", "created", "model")}

        def chunk(delta: dict, finish_reason: str | None = None) -> tuple[None, dict]:
            out = {**head, "object": "chat.completion.chunk",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]}
            if self.include_usage:
                out["usage"] = None
            return None, out

        events = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": piece}) for piece in _pieces(message.get("content") or "")]
        for i, call in enumerate(message.get("tool_calls") or []):
            fn = call["function"]
            events.append(chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                                 "function": {"name": fn["name"], "arguments": ""}}]}))
            events += [chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
                       for piece in _pieces(fn["arguments"])]
        events.append(chunk({}, finish))
        if self.include_usage:
            events.append((None, {**head, "object": "chat.completion.chunk", "choices": [],
                                  "usage": completion["usage"]}))
        return events


class Responses:
    """OpenAI's Responses API (see the module docstring). `history` maps this episode's stored response ids to their
    conversations (chat messages), for `previous_response_id`."""

    path = "/v1/responses"

    def __init__(self, raw: object, model: str, history: dict):
        body = _body(raw)
        _check_model(body.get("model"), model)
        self.stream = _stream_flag(body)
        self.body, self.history = body, history
        self.store = body.get("store", True) is not False
        previous = body.get("previous_response_id")
        earlier: list[dict] = []
        if previous is not None:
            if previous not in history:
                raise RequestError(f"previous_response_id={_short(previous)} is not a stored response of this "
                                   "episode: send the id of a response it received (with store left true)", 404)
            earlier = history[previous]
        self.conversation = earlier + self._items(body.get("input"))
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise RequestError(f"instructions={_short(instructions)}: send a string")
        system = [{"role": "system", "content": instructions}] if instructions else []
        self.chat_body = {"model": body["model"], "messages": system + self.conversation}
        if body.get("tools"):
            self.chat_body["tools"] = _function_tools(body["tools"], self._function,
                                                      "{'type': 'function', 'name': ..., 'parameters': {...}}")
        if body.get("max_output_tokens") is not None:
            self.chat_body["max_tokens"] = body["max_output_tokens"]
        self.id = _uid("resp_")
        self.created = int(time.time())

    @staticmethod
    def _function(tool: dict) -> dict | None:
        if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            return None
        return {key: tool[key] for key in ("name", "description", "parameters") if key in tool}

    @staticmethod
    def _items(items: object) -> list[dict]:
        """The input items as chat messages (see the module docstring)."""
        if isinstance(items, str):
            return [{"role": "user", "content": items}]
        if not isinstance(items, list) or not items:
            raise RequestError(f"input={_short(items)}: send a string or a non-empty list of input items")
        messages: list[dict] = []
        for k, item in enumerate(items):
            kind = item.get("type", "message") if isinstance(item, dict) else None
            if kind == "message":
                role = item.get("role")
                if role not in ("user", "assistant", "system", "developer"):
                    raise RequestError(f"input[{k}].role={_short(role)}: send user, assistant, system or developer")
                messages.append({"role": role, "content": Responses._text(k, item.get("content"))})
            elif kind == "function_call":
                if not isinstance(item.get("name"), str) or not isinstance(item.get("call_id"), str):
                    raise RequestError(f"input[{k}]={_short(item)}: a function_call item needs its name, call_id and "
                                       "arguments")
                if not messages or messages[-1]["role"] != "assistant":
                    messages.append({"role": "assistant", "content": ""})
                messages[-1].setdefault("tool_calls", []).append(
                    {"id": item["call_id"], "type": "function",
                     "function": {"name": item["name"], "arguments": item.get("arguments", "")}})
            elif kind == "function_call_output":
                output = item.get("output")
                messages.append({"role": "tool", "tool_call_id": str(item.get("call_id")),
                                 "content": output if isinstance(output, str) else Responses._text(k, output)})
            else:
                raise RequestError(f"input[{k}].type={_short(kind)}: the training endpoint reads message, "
                                   "function_call and function_call_output items")
        return messages

    @staticmethod
    def _text(k: int, content: object) -> str:
        if isinstance(content, str):
            return content
        if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") in ("input_text", "output_text")
                                             and isinstance(p.get("text"), str) for p in content):
            return "".join(p["text"] for p in content)
        raise RequestError(f"input[{k}].content={_short(content)}: send a string or a list of input_text/output_text "
                           "parts (the policy reads text only)")

    @staticmethod
    def error(status: int, message: str) -> dict:
        return error_body(message, status)

    def _output(self, completion: dict) -> list[dict]:
        message, _ = _message_of(completion)
        output = []
        if message.get("content") or not message.get("tool_calls"):  # an empty reply too: sent back, it joins
            output.append({"type": "message", "id": _uid("msg_"), "status": "completed", "role": "assistant",
                           "content": [{"type": "output_text", "text": message["content"] or "", "annotations": [],
                                        "logprobs": []}]})
        output += [{"type": "function_call", "id": _uid("fc_"), "call_id": call["id"],
                    "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                    "status": "completed"} for call in message.get("tool_calls") or []]
        return output

    def _response(self, completion: dict | None, output: list[dict]) -> dict:
        """The response object; `completion` None: the response in progress (no output yet)."""
        finish = _message_of(completion)[1] if completion is not None else None
        status = "in_progress" if finish is None else "incomplete" if finish == "length" else "completed"
        usage = completion and completion["usage"]
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "model": self.chat_body["model"], "output": output, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": self.body.get("instructions"), "tools": self.body.get("tools") or [],
            "tool_choice": self.body.get("tool_choice", "auto"), "parallel_tool_calls": True,
            "previous_response_id": self.body.get("previous_response_id"), "metadata": {},
            "max_output_tokens": self.body.get("max_output_tokens"), "store": self.store,
            "usage": None if not usage else {
                "input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                "total_tokens": usage["total_tokens"], "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0}},
        }

    def reply(self, completion: dict, output: list[dict] | None = None) -> dict:
        output = self._output(completion) if output is None else output
        if self.store:  # the conversation a later request may continue with previous_response_id
            message, _ = _message_of(completion)
            self.history[self.id] = self.conversation + [message]
        return self._response(completion, output)

    def events(self, completion: dict) -> Events:
        output = self._output(completion)
        events: Events = []

        def event(kind: str, **data) -> None:
            events.append((kind, {"type": kind, "sequence_number": len(events), **data}))

        event("response.created", response=self._response(None, []))
        event("response.in_progress", response=self._response(None, []))
        for index, item in enumerate(output):
            at = {"output_index": index, "item_id": item["id"]}
            if item["type"] == "message":
                text = item["content"][0]["text"]
                event("response.output_item.added", output_index=index, item={**item, "status": "in_progress",
                                                                              "content": []})
                empty = {**item["content"][0], "text": ""}
                event("response.content_part.added", **at, content_index=0, part=empty)
                for piece in _pieces(text):
                    event("response.output_text.delta", **at, content_index=0, delta=piece, logprobs=[])
                event("response.output_text.done", **at, content_index=0, text=text, logprobs=[])
                event("response.content_part.done", **at, content_index=0, part=item["content"][0])
            else:
                event("response.output_item.added", output_index=index,
                      item={**item, "status": "in_progress", "arguments": ""})
                for piece in _pieces(item["arguments"]):
                    event("response.function_call_arguments.delta", **at, delta=piece)
                event("response.function_call_arguments.done", **at, name=item["name"], arguments=item["arguments"])
            event("response.output_item.done", output_index=index, item=item)
        final = self.reply(completion, output)
        event("response.incomplete" if final["status"] == "incomplete" else "response.completed", response=final)
        return events


class Messages:
    """Anthropic's Messages API (see the module docstring)."""

    path = "/v1/messages"
    STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}

    def __init__(self, raw: object, model: str, history: dict):
        body = _body(raw)
        _check_model(body.get("model"), model)
        self.stream = _stream_flag(body)
        self.model = body["model"]
        system = body.get("system")
        if system is not None and not isinstance(system, str):
            system = self._blocks_text("system", system)
        messages = [{"role": "system", "content": system}] if system else []
        raw_messages = body.get("messages")
        if not isinstance(raw_messages, list) or not raw_messages:
            raise RequestError(f"messages={_short(raw_messages)}: send a non-empty list of messages")
        for k, message in enumerate(raw_messages):
            messages += self._message(k, message)
        self.chat_body = {"model": self.model, "messages": messages}
        if body.get("tools"):
            self.chat_body["tools"] = _function_tools(body["tools"], self._function,
                                                      "{'name': ..., 'description': ..., 'input_schema': {...}}")
        if body.get("max_tokens") is not None:
            self.chat_body["max_tokens"] = body["max_tokens"]

    @staticmethod
    def _blocks_text(where: str, blocks: object) -> str:
        if isinstance(blocks, list) and all(isinstance(b, dict) and b.get("type") == "text"
                                            and isinstance(b.get("text"), str) for b in blocks):
            return "".join(b["text"] for b in blocks)
        raise RequestError(f"{where}={_short(blocks)}: send a string or a list of text blocks (the policy reads text "
                           "only)")

    @staticmethod
    def _function(tool: dict) -> dict | None:
        if not isinstance(tool.get("name"), str) or not isinstance(tool.get("input_schema"), dict):
            return None
        return {"name": tool["name"], "parameters": tool["input_schema"],
                **({"description": tool["description"]} if "description" in tool else {})}

    @classmethod
    def _message(cls, k: int, message: object) -> list[dict]:
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise RequestError(f"messages[{k}].role={_short(role)}: send user or assistant")
        content = message.get("content")
        if isinstance(content, str):
            return [{"role": role, "content": content}]
        if not isinstance(content, list):
            raise RequestError(f"messages[{k}].content={_short(content)}: send a string or a list of content blocks")
        out: list[dict] = []
        text: list[str] = []
        calls: list[dict] = []
        for j, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else None
            where = f"messages[{k}].content[{j}]"
            if kind == "text" and isinstance(block.get("text"), str):
                text.append(block["text"])
            elif kind == "tool_use" and role == "assistant" and isinstance(block.get("name"), str):
                calls.append({"id": str(block.get("id")), "type": "function",
                              "function": {"name": block["name"], "arguments": json.dumps(block.get("input") or {})}})
            elif kind == "tool_result" and role == "user":
                if text:  # the user's text before this result
                    out.append({"role": "user", "content": "".join(text)})
                    text = []
                result = block.get("content", "")
                out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id")),
                            "content": result if isinstance(result, str) else cls._blocks_text(where, result)})
            else:
                raise RequestError(f"{where}={_short(block)}: the training endpoint reads text, tool_use (assistant) "
                                   "and tool_result (user) blocks")
        if role == "assistant":
            out.append({"role": "assistant", "content": "".join(text), **({"tool_calls": calls} if calls else {})})
        elif text:
            out.append({"role": "user", "content": "".join(text)})
        return out

    @staticmethod
    def error(status: int, message: str) -> dict:
        kind = {401: "authentication_error", 404: "not_found_error", 413: "request_too_large"}.get(
            status, "invalid_request_error" if status < 500 else "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def _content(self, completion: dict) -> list[dict]:
        message, _ = _message_of(completion)
        blocks = [{"type": "text", "text": message["content"]}] if message.get("content") else []
        return blocks + [{"type": "tool_use", "id": call["id"].replace("call_", "toolu_", 1),
                          "name": call["function"]["name"], "input": json.loads(call["function"]["arguments"])}
                         for call in message.get("tool_calls") or []]

    def reply(self, completion: dict, content: list[dict] | None = None) -> dict:
        usage = completion["usage"]
        return {"id": completion["id"].replace("chatcmpl-", "msg_", 1), "type": "message", "role": "assistant",
                "model": self.model, "content": self._content(completion) if content is None else content,
                "stop_reason": self.STOP[_message_of(completion)[1]], "stop_sequence": None,
                "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]}}

    def events(self, completion: dict) -> Events:
        final = self.reply(completion)
        events: Events = [("message_start", {"type": "message_start", "message": {
            **final, "content": [], "stop_reason": None, "usage": {**final["usage"], "output_tokens": 0}}})]

        def event(kind: str, **data) -> None:
            events.append((kind, {"type": kind, **data}))

        for index, block in enumerate(final["content"]):
            if block["type"] == "text":
                event("content_block_start", index=index, content_block={"type": "text", "text": ""})
                for piece in _pieces(block["text"]):
                    event("content_block_delta", index=index, delta={"type": "text_delta", "text": piece})
            else:
                event("content_block_start", index=index, content_block={**block, "input": {}})
                for piece in _pieces(json.dumps(block["input"])):
                    event("content_block_delta", index=index, delta={"type": "input_json_delta",
                                                                     "partial_json": piece})
            event("content_block_stop", index=index)
        event("message_delta", delta={"stop_reason": final["stop_reason"], "stop_sequence": None},
              usage={"output_tokens": final["usage"]["output_tokens"]})
        event("message_stop")
        return events


DIALECTS = {d.path: d for d in (ChatCompletions, Responses, Messages)}


def sse(events: Events, done: bool) -> bytes:
    """Server-sent events: each `event:` line (where named) and its `data:` line; `data: [DONE]` last if `done`."""
    lines = [(f"event: {name}\n" if name else "") + f"data: {json.dumps(data)}\n\n" for name, data in events]
    return ("".join(lines) + ("data: [DONE]\n\n" if done else "")).encode()
