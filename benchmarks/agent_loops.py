"""One turn of the benchmark agents of `agent_endpoint.py` in each dialect, on the real clients (`openai`,
`anthropic`), shared by its thread agents and by `process_agent.py`: each sends the history and returns the reply's
messages to append. `session` holds `client` (the dialect's) and `model`."""

NEW_TOKENS = 8


def chat_turn(session, history: list[dict], stream: bool) -> list[dict]:
    client = session.client
    if not stream:
        message = client.chat.completions.create(model=session.model, messages=history, max_tokens=NEW_TOKENS)
        return [message.choices[0].message.model_dump(exclude_none=True)]
    text = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
        model=session.model, messages=history, max_tokens=NEW_TOKENS, stream=True) if chunk.choices)
    return [{"role": "assistant", "content": text}]


def responses_turn(session, history: list[dict], stream: bool) -> list[dict]:
    ask = dict(model=session.model, input=history, max_output_tokens=NEW_TOKENS, store=False)
    if not stream:
        response = session.client.responses.create(**ask)
    else:
        ends = ("response.completed", "response.incomplete")
        response = next(e.response for e in session.client.responses.create(**ask, stream=True) if e.type in ends)
    return [item.model_dump(exclude_none=True) for item in response.output]


def messages_turn(session, history: list[dict], stream: bool) -> list[dict]:
    ask = dict(model=session.model, messages=history, max_tokens=NEW_TOKENS)
    if not stream:
        message = session.client.messages.create(**ask)
    else:
        with session.client.messages.stream(**ask) as events:
            message = events.get_final_message()
    return [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]}]


DIALECTS = {"chat": chat_turn, "responses": responses_turn, "messages": messages_turn}
