"""The endpoint's three dialects, streamed and not, with the real `openai` and `anthropic` clients: each plays a
tool call then two text turns, and every dialect's episode is one token-exact sample (the ids trained are the ids
sampled, the tool call's ids never re-encoded), its tool call in the dialect's shape, its errors in the dialect's
error shape, an unknown model answered 404, and the key checked before the body is read."""

import json
import socket

import anthropic
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from rollout_checks import step_samples_of
from test_agent_endpoint import TOOLS, Recorded, char_ids, make_runner
from test_agent_endpoint import policy as policy  # noqa: F401 (the fixture)

from trl_multiturn.rollout.generation import hf_generate_fn

FUNCTION = TOOLS[0]["function"]
RESPONSES_TOOLS = [{"type": "function", **FUNCTION}]
MESSAGES_TOOLS = [{"name": FUNCTION["name"], "description": FUNCTION["description"],
                   "input_schema": FUNCTION["parameters"]}]
CALL_TEXT = '<tool_call>\n{"name": "go", "arguments": {"direction": "north"}}\n</tool_call>'


class FirstCallScripted:
    """The first generate call answers every context with `sample` (a tool call, one token per character: ids no
    tokenizer would produce from its text); later calls are the tiny model's greedy replies."""

    def __init__(self, sample, model_generate):
        self.sample, self.model_generate, self.calls = sample, model_generate, 0

    def __call__(self, contexts, max_new_tokens):
        self.calls += 1
        if self.calls == 1:
            return [self.sample for _ in contexts], [[-0.5] * len(self.sample) for _ in contexts]
        return self.model_generate(contexts, max_new_tokens)


def chat_turn(client, model, messages, stream):
    if stream:  # the chunks accumulated by the client's own stream state
        state = ChatCompletionStreamState()
        for chunk in client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=100,
                                                    stream=True, stream_options={"include_usage": True}):
            state.handle_chunk(chunk)
        completion = state.current_completion_snapshot
    else:
        completion = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=100)
    assert completion.usage.completion_tokens > 0
    message = completion.choices[0].message
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
    return message.model_dump(exclude_none=True, exclude={"parsed"}), message.content or "", calls, message.tool_calls


def chat_agent(stream):
    def agent(task, session):
        client, seen = session.openai(), task["seen"]
        messages = [{"role": "system", "content": "You explore."}, {"role": "user", "content": "Where to?"}]
        for k in range(3):
            sent, text, calls, raw_calls = chat_turn(client, session.model, messages, stream)
            seen.append((text, calls))
            messages.append(sent)
            messages += ([{"role": "tool", "tool_call_id": raw_calls[0].id, "content": "You go north."}] if calls
                         else [{"role": "user", "content": f"You see room {k}."}])
        return 1.0
    return agent


def responses_turn(client, model, **kwargs):
    if kwargs.pop("stream"):
        with client.responses.stream(model=model, tools=RESPONSES_TOOLS, max_output_tokens=100, **kwargs) as events:
            # the client's stream state checks each event; a reply cut at max_output_tokens ends response.incomplete
            response = next(e.response for e in events if e.type in ("response.completed", "response.incomplete"))
    else:
        response = client.responses.create(model=model, tools=RESPONSES_TOOLS, max_output_tokens=100, **kwargs)
    assert response.usage.output_tokens > 0
    calls = [(item.name, json.loads(item.arguments), item.call_id) for item in response.output
             if item.type == "function_call"]
    return response, calls


def responses_agent(stream):
    """Streamed: sends its whole history each turn (as Codex does, store=False); not streamed: chains each request
    to the last with previous_response_id, sending only the new items."""
    def agent(task, session):
        client, seen = session.openai(), task["seen"]
        items, previous = [{"role": "user", "content": "Where to?"}], None
        for k in range(3):
            chaining = {"store": False} if stream else {"previous_response_id": previous}
            response, calls = responses_turn(client, session.model, stream=stream, instructions="You explore.",
                                             input=items, **chaining)
            seen.append((response.output_text, [c[:2] for c in calls]))
            new = ([{"type": "function_call_output", "call_id": calls[0][2], "output": "You go north."}] if calls
                   else [{"role": "user", "content": [{"type": "input_text", "text": f"You see room {k}."}]}])
            if stream:
                items = items + [item.model_dump(exclude_none=True) for item in response.output] + new
            else:
                items, previous = new, response.id
        return 1.0
    return agent


def messages_agent(stream):
    def agent(task, session):
        client, seen = session.anthropic(), task["seen"]
        messages = [{"role": "user", "content": "Where to?"}]
        for k in range(3):
            ask = dict(model=session.model, max_tokens=100, system=[{"type": "text", "text": "You explore."}],
                       messages=messages, tools=MESSAGES_TOOLS)
            if stream:
                with client.messages.stream(**ask) as events:
                    message = events.get_final_message()
            else:
                message = client.messages.create(**ask)
            assert message.usage.output_tokens > 0
            text = "".join(b.text for b in message.content if b.type == "text")
            uses = [b for b in message.content if b.type == "tool_use"]
            seen.append((text, [(b.name, b.input) for b in uses]))
            assert message.stop_reason == "tool_use" if uses else message.stop_reason in ("end_turn", "max_tokens")
            blocks = [b.model_dump(exclude_none=True) for b in message.content]
            messages.append({"role": "assistant", "content": blocks})
            messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                          "content": "You go north."}] if uses
                             else [{"type": "text", "text": f"You see room {k}."}]})
        return 1.0
    return agent


AGENTS = {"chat": chat_agent, "responses": responses_agent, "messages": messages_agent}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("dialect", sorted(AGENTS))
def test_each_dialect_records_one_token_exact_episode_with_its_tool_call(policy, dialect, stream):
    model, tokenizer = policy
    sample = char_ids(tokenizer, CALL_TEXT) + [tokenizer.eos_token_id]
    generate = Recorded(FirstCallScripted(sample, hf_generate_fn(model, tokenizer)))
    runner = make_runner(AGENTS[dialect](stream), policy, generate, batch_wait=60.0, max_completion_length=100)
    rows = [{"seen": []}, {"seen": []}]
    try:
        episodes = runner(rows)
    finally:
        runner.close()
    assert [ep.failure for ep in episodes] == [None, None]
    assert runner.last_stats == {"joined": 4, "new_samples": 2, "failed": 0, "stepwise": 0}
    assert [len(contexts) for contexts, _ in generate.calls] == [2, 2, 2]  # one generate call per turn
    sampled = generate.sampled()
    for row, ep in zip(rows, episodes):
        assert row["seen"][0] == ("", [("go", {"direction": "north"})])  # the tool call, in the dialect's shape
        assert ep.num_turns == 3 and not ep.step_contexts
        for start, end in ep.turn_spans:  # trained on exactly the ids sampled, from exactly the context sampled on
            assert sampled[tuple(ep.prompt_ids + ep.completion_ids[:start])] == ep.completion_ids[start:end]
        start, end = ep.turn_spans[0]
        assert ep.completion_ids[start:end] == sample and ep.logprobs[start:end] == [-0.5] * len(sample)
        later = [tokenizer.decode(ep.completion_ids[s:e], skip_special_tokens=True) for s, e in ep.turn_spans[1:]]
        assert [text for text, _ in row["seen"][1:]] == later  # the replies as the client rebuilt them
        observations = tokenizer.decode([t for t, m in zip(ep.completion_ids, ep.env_mask) if not m])
        assert "You go north." in observations and "You see room 1." in observations
    assert '"name": "go"' in tokenizer.decode(episodes[0].prompt_ids)  # the tools reached the model's prompt


def raw_post(base_url: str, head: bytes) -> bytes:
    """Send only a request's head (its body announced, never sent) and read the answer."""
    host, port = base_url.removeprefix("http://").split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(head)
        answer = b""
        while chunk := sock.recv(65536):  # until the endpoint closes the connection
            answer += chunk
        return answer


def test_errors_come_in_each_dialects_shape(policy):
    seen = {}

    def agent(task, session):
        chat, claude = session.openai(), session.anthropic()
        with pytest.raises(openai.NotFoundError) as chat_404:
            chat.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.NotFoundError) as responses_404:
            chat.responses.create(model="gpt-4o", input="hi")
        with pytest.raises(anthropic.NotFoundError) as messages_404:
            claude.messages.create(model="claude-x", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.NotFoundError, match="previous_response_id"):
            chat.responses.create(model=session.model, input="hi", previous_response_id="resp_none")
        seen["404"] = [e.value.body for e in (chat_404, responses_404)] + [messages_404.value.body]
        wrong = "nope." + session.api_key.partition(".")[2]  # this episode, another run's secret
        with pytest.raises(anthropic.AuthenticationError) as refused:
            anthropic.Anthropic(base_url=session.base_url.removesuffix("/v1"), api_key="nope",
                                max_retries=0).messages.create(model=session.model, max_tokens=5,
                                                              messages=[{"role": "user", "content": "hi"}])
        seen["401"] = refused.value.body
        # the key is checked before the body is read: a wrong key is answered though its body never comes
        seen["early"] = [raw_post(session.base_url, f"POST {path} HTTP/1.1\r\nHost: x\r\n{header}\r\n"
                                                   "Content-Length: 1000\r\n\r\n".encode())
                         for path, header in (("/v1/responses", f"Authorization: Bearer {wrong}"),
                                              ("/v1/messages", "x-api-key: nope"))]
        seen["models"] = ([m.id for m in chat.models.list()], chat.models.retrieve(session.model).id,
                          [m.id for m in claude.models.list()])
        with pytest.raises(anthropic.BadRequestError) as bad:  # an image: refused, naming the block
            claude.messages.create(model=session.model, max_tokens=5, messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
        seen["400"] = bad.value.body
        return 1.0

    runner = make_runner(agent, policy)
    try:
        (ep,) = runner([{}])
    finally:
        runner.close()
    chat_404, responses_404, messages_404 = seen["404"]
    assert chat_404["message"].startswith("the model 'gpt-4o' does not exist") and "'policy'" in chat_404["message"]
    assert responses_404["message"].startswith("the model 'gpt-4o' does not exist")
    assert messages_404 == {"type": "error", "error": {"type": "not_found_error", "message": (
        "the model 'claude-x' does not exist on this endpoint: send model='policy'")}}
    assert seen["401"]["type"] == "error" and seen["401"]["error"]["type"] == "authentication_error"
    responses_401, messages_401 = seen["early"]
    assert responses_401.startswith(b"HTTP/1.1 401") and b'"code": 401' in responses_401
    assert messages_401.startswith(b"HTTP/1.1 401") and b'"authentication_error"' in messages_401
    assert seen["models"] == (["policy"], "policy", ["policy"])
    assert seen["400"]["error"]["type"] == "invalid_request_error"
    assert "messages[0].content[0]" in seen["400"]["error"]["message"]
    # a malformed request fails its episode (as in every dialect); an unknown model alone does not
    assert ep.failed and "messages[0].content[0]" in ep.failure


def test_a_responses_chain_that_branches_starts_a_new_sample_never_a_retokenised_one(policy):
    """Chaining to an older response (not the last) is not an extension of the last request: a new step sample,
    rendered from the chained conversation, and every sample trains on its reply's ids as sampled."""
    model, tokenizer = policy
    sent = []

    def agent(task, session):
        client = session.openai()
        first = client.responses.create(model=session.model, input="Where to?", max_output_tokens=6)
        for text in ("Go on.", "Try again."):  # both continue the first response: the second branches
            sent.append(client.responses.create(model=session.model, previous_response_id=first.id,
                                                input=text, max_output_tokens=6))
        return 1.0

    generate = Recorded(hf_generate_fn(model, tokenizer))
    runner = make_runner(agent, policy, generate)
    try:
        (ep,) = runner([{}])
    finally:
        runner.close()
    assert not ep.failed and runner.last_stats == {"joined": 1, "new_samples": 2, "failed": 0, "stepwise": 1}
    branch = tokenizer.decode(ep.step_contexts[2])
    assert "Try again." in branch and "Go on." not in branch  # the first response's conversation, then the new input
    sampled = generate.sampled()
    for sample in step_samples_of([ep]):
        assert sampled[tuple(sample.prompt_ids)] == sample.completion_ids
