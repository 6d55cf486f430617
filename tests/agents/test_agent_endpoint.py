"""The agent chat endpoint with the real `openai` client on loopback: turns that join their episode token-exactly,
tool calls in OpenAI's format from the sampled ids, history rewriting as step samples, shared generate calls, the
run's secret, and every fault failing only its episode."""

import http.client
import json
import math
import queue
import socket
import threading

import openai
import pytest
from rollout_checks import assert_sample_token_exact, assert_token_exact, step_samples_of
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_multiturn.agents import AgentEnvironment, AgentResult, AgentRunner
from trl_multiturn.rollout.generation import hf_generate_fn
from trl_multiturn.rollout.rules import EpisodeRules

TOOLS = [{"type": "function", "function": {
    "name": "go", "description": "Move in a direction.",
    "parameters": {"type": "object", "properties": {"direction": {"type": "string"}}, "required": ["direction"]}}}]


@pytest.fixture(scope="module")
def policy(tiny_chatml_model):
    return AutoModelForCausalLM.from_pretrained(tiny_chatml_model).eval(), AutoTokenizer.from_pretrained(
        tiny_chatml_model)


class Recorded:
    """A generate function that records each call's contexts and completions."""

    def __init__(self, generate):
        self.generate, self.calls = generate, []

    def __call__(self, contexts, max_new_tokens):
        completions, logprobs = self.generate(contexts, max_new_tokens)
        self.calls.append((contexts, completions))
        return completions, logprobs

    def sampled(self) -> dict:
        return {tuple(c): list(done) for contexts, completions in self.calls for c, done in zip(contexts, completions)}


def scripted(ids: list[int], logprob: float = -0.5):
    """A stand-in for a model whose sample is known: every context gets `ids`, each with log-prob `logprob`."""
    def generate(contexts, max_new_tokens):
        return [ids[:max_new_tokens] for _ in contexts], [[logprob] * len(ids[:max_new_tokens]) for _ in contexts]
    return generate


def make_runner(agent, policy, generate=None, **kwargs):
    model, tokenizer = policy
    env = {k: kwargs.pop(k) for k in ("agent_timeout", "batch_wait") if k in kwargs}
    rules = EpisodeRules(**{"max_turns": 4, "max_completion_length": 6,
                            **{k: kwargs.pop(k) for k in ("max_turns", "max_completion_length", "episode_format")
                               if k in kwargs}})
    generate = generate or Recorded(hf_generate_fn(model, tokenizer))
    return AgentRunner(AgentEnvironment(agent, **env), tokenizer, generate, rules, **kwargs)


def appending_agent(turns: int = 3, tools: list | None = TOOLS):
    """An agent that keeps its whole history: each reply as the endpoint returned it, then a new message."""
    def agent(task, session):
        client = session.openai()
        messages = [{"role": "system", "content": "You explore."}, {"role": "user", "content": task["goal"]}]
        for k in range(turns):
            reply = client.chat.completions.create(model=session.model, messages=messages, tools=tools)
            messages += [reply.choices[0].message.model_dump(exclude_none=True),
                         {"role": "user", "content": f"You see room {k}."}]
        return AgentResult(reward=1.0, won=True)
    return agent


async def async_appending_agent(task, session):
    client = session.async_openai()
    messages = [{"role": "user", "content": task["goal"]}]
    for k in range(3):
        reply = await client.chat.completions.create(model=session.model, messages=messages)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": f"Room {k}."}]
    await client.close()
    return 1.0


ROWS = [{"goal": "Find the key."}, {"goal": "Open the chest."}, {"goal": "Go north twice."}]


@pytest.mark.parametrize("agent", [appending_agent(), async_appending_agent], ids=["sync", "async"])
def test_turns_that_extend_the_history_join_one_token_exact_sample(policy, agent):
    model, tokenizer = policy
    generate = Recorded(hf_generate_fn(model, tokenizer))
    runner = make_runner(agent, policy, generate, batch_wait=60.0)
    try:
        episodes = runner(ROWS)
    finally:
        runner.close()
    assert [ep.failed for ep in episodes] == [False] * 3, [ep.failure for ep in episodes]
    assert runner.last_stats == {"joined": 6, "new_samples": 3, "failed": 0, "stepwise": 0}
    # one generate call per turn for all three episodes: all were waiting, so no call waited out batch_wait
    assert [len(contexts) for contexts, _ in generate.calls] == [3, 3, 3]
    sampled = generate.sampled()
    for ep in episodes:
        assert ep.num_turns == 3 and not ep.step_contexts and ep.turn_rewards == [0.0, 0.0, 1.0]
        assert_token_exact(model, ep)  # greedy: every sampled token is the argmax of exactly the tokens before it
        for start, end in ep.turn_spans:  # the model was given exactly the trajectory's tokens, and sampled these
            assert sampled[tuple(ep.prompt_ids + ep.completion_ids[:start])] == ep.completion_ids[start:end]
        env_text = tokenizer.decode([t for t, m in zip(ep.completion_ids, ep.env_mask) if not m])
        assert "You see room 1." in env_text or "Room 1." in env_text
    if agent is not async_appending_agent:
        assert '"name": "go"' in tokenizer.decode(episodes[0].prompt_ids)  # the tools reached the model's prompt


def test_turns_join_on_llama3s_template_and_the_tools_it_drops_are_refused(tiny_llama3_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_llama3_model).eval()
    policy = (model, AutoTokenizer.from_pretrained(tiny_llama3_model))
    runner = make_runner(appending_agent(2, tools=None), policy)
    try:
        episodes = runner(ROWS[:2])
    finally:
        runner.close()
    assert runner.last_stats == {"joined": 2, "new_samples": 2, "failed": 0, "stepwise": 0}
    for ep in episodes:
        assert_token_exact(model, ep)
    # Llama 3.0's template renders no tools: a request with tools is refused, naming the setting that fixes it
    runner = make_runner(appending_agent(2), policy)
    try:
        episodes = runner(ROWS[:2])
    finally:
        runner.close()
    assert all(ep.failed and "drops `tools`" in ep.failure and "chat_template_path" in ep.failure for ep in episodes)


def test_a_failing_generate_call_stops_the_rollout_and_answers_every_agent(policy):
    answered = queue.Queue()

    def agent(task, session):
        try:
            session.openai().chat.completions.create(model=session.model, messages=[{"role": "user", "content": "hi"}])
        except openai.APIStatusError as exc:
            answered.put(exc.status_code)
        return 1.0

    def broken(contexts, max_new_tokens):
        raise RuntimeError("CUDA out of memory")

    runner = make_runner(agent, policy, broken, batch_wait=60.0)
    try:
        with pytest.raises(RuntimeError, match="out of memory"):  # the trainer's own failure is the trainer's
            runner(ROWS)
    finally:
        runner.close()
    assert [answered.get(timeout=120) for _ in ROWS] == [410, 410, 410]  # each agent's thread got its answer


def char_ids(tokenizer, text: str) -> list[int]:
    """`text` as one token per character: a sample no tokenizer would produce from the text."""
    return [i for ch in text for i in tokenizer.encode(ch, add_special_tokens=False)]


def test_tool_calls_come_back_in_openai_format_and_join_without_retokenising(policy):
    _, tokenizer = policy
    call_text = '<tool_call>\n{"name": "go", "arguments": {"direction": "north"}}\n</tool_call>'
    sample = char_ids(tokenizer, call_text) + [tokenizer.eos_token_id]
    assert sample != tokenizer.encode(call_text, add_special_tokens=False) + [tokenizer.eos_token_id]
    seen = {}

    def agent(task, session):
        client = session.openai()
        messages = [{"role": "user", "content": "Where to?"}]
        first = client.chat.completions.create(model=session.model, messages=messages, tools=TOOLS, max_tokens=200)
        seen["first"] = first
        call = first.choices[0].message.tool_calls[0]
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "You go north."}]
        client.chat.completions.create(model=session.model, messages=messages, tools=TOOLS, max_tokens=200)
        return 1.0

    generate = Recorded(scripted(sample))
    runner = make_runner(agent, policy, generate, max_completion_length=200)
    try:
        (ep,) = runner([{}])
    finally:
        runner.close()
    choice = seen["first"].choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "go"
    assert json.loads(call.function.arguments) == {"direction": "north"}
    assert not ep.failed and runner.last_stats["joined"] == 1 and ep.num_turns == 2
    (first_context, _), (second_context, _) = [(c[0], d) for c, d in generate.calls]
    # the second context holds the reply's ids as sampled, never re-encoded from its text
    assert second_context[: len(first_context) + len(sample)] == first_context + sample
    assert "You go north." in tokenizer.decode(second_context[len(first_context) + len(sample):])
    start, end = ep.turn_spans[0]
    assert ep.completion_ids[start:end] == sample and ep.logprobs[start:end] == [-0.5] * len(sample)
    assert all(math.isnan(lp) for lp, m in zip(ep.logprobs, ep.env_mask) if not m)


def test_an_agent_that_rewrites_its_history_yields_step_samples_of_its_episode(policy):
    model, tokenizer = policy
    sent = {}

    def agent(task, session):
        client = session.openai()
        messages = [{"role": "user", "content": task["goal"]}]
        for k in range(3):
            sent.setdefault(task["goal"], []).append([dict(m) for m in messages])
            reply = client.chat.completions.create(model=session.model, messages=messages).choices[0].message
            if task["rewrite"]:  # a summary of the last reply replaces the history
                messages = [{"role": "user", "content": f"{task['goal']} Last time you said {len(reply.content)} "
                                                         "characters."}]
            else:
                messages += [reply.model_dump(exclude_none=True), {"role": "user", "content": f"Room {k}."}]
        return 1.0

    rows = [{"goal": "Summarise.", "rewrite": True}, {"goal": "Append.", "rewrite": False}]
    runner = make_runner(agent, policy)
    try:
        episodes = runner(rows)
    finally:
        runner.close()
    assert runner.last_stats == {"joined": 2, "new_samples": 4, "failed": 0, "stepwise": 1}
    rewritten, appended = episodes
    assert len(rewritten.step_contexts) == len(appended.step_contexts) == 3  # the whole batch is step samples
    for context, messages in zip(rewritten.step_contexts, sent["Summarise."]):  # each rendered from what was sent
        assert context == tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                        return_dict=True)["input_ids"]
    for k in range(2):  # the joined episode's contexts still grow by the sampled ids themselves
        start, end = appended.turn_spans[k]
        assert appended.step_contexts[k + 1][: len(appended.step_contexts[k]) + end - start] == (
            appended.step_contexts[k] + appended.completion_ids[start:end])
    samples = step_samples_of(episodes)
    assert [s.episode for s in samples] == [0, 0, 0, 1, 1, 1]  # the credit's episode of each step sample
    for s in samples:
        assert_sample_token_exact(model, s)


def test_stepwise_format_makes_every_call_a_step_sample(policy):
    runner = make_runner(appending_agent(2), policy, episode_format="stepwise")
    try:
        (ep,) = runner(ROWS[:1])
    finally:
        runner.close()
    assert runner.last_stats["joined"] == 1 and len(ep.step_contexts) == 2 and ep.env_mask == [1] * len(
        ep.completion_ids)


def post(base_url: str, key: str | None, body: bytes, path: str = "/v1/chat/completions") -> int:
    host, port = base_url.removeprefix("http://").split("/")[0].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    connection.request("POST", path, body=body, headers=headers)
    status = connection.getresponse().status
    connection.close()
    return status


def test_requests_without_the_runs_secret_are_refused(policy):
    seen = {}

    def agent(task, session):
        assert session.base_url.startswith("http://127.0.0.1:")
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
        seen["no key"] = post(session.base_url, None, body)
        seen["other run"] = post(session.base_url, "x" * 43 + "." + session.api_key.partition(".")[2], body)
        for key in ("wrong", session.api_key.partition(".")[0]):  # a guess, the run's secret without an episode
            try:
                openai.OpenAI(base_url=session.base_url, api_key=key, max_retries=0).chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}])
            except openai.AuthenticationError:
                seen.setdefault("openai 401", 0)
                seen["openai 401"] += 1
        seen["models"] = [m.id for m in session.openai().models.list()]
        session.openai().chat.completions.create(model=session.model, messages=[{"role": "user", "content": "hi"}])
        seen["session"] = session
        return 1.0

    runner = make_runner(agent, policy)
    try:
        (ep,) = runner([{}])
        assert not ep.failed and ep.num_turns == 1
        assert seen["no key"] == 401 and seen["other run"] == 401 and seen["openai 401"] == 2
        assert seen["models"] == ["policy"]
        with pytest.raises(openai.APIStatusError) as refused:  # the episode's key once its rollout ended
            seen["session"].openai().chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert refused.value.status_code == 410
    finally:
        runner.close()


def test_the_turn_budget_truncates_the_episode_and_keeps_its_reward(policy):
    def agent(task, session):
        client = session.openai()
        messages = [{"role": "user", "content": "Go."}]
        try:
            while True:
                reply = client.chat.completions.create(model=session.model, messages=messages, max_tokens=3)
                assert reply.usage.completion_tokens <= 3
                messages += [reply.choices[0].message.model_dump(exclude_none=True),
                             {"role": "user", "content": "Again."}]
        except openai.BadRequestError as exc:
            assert "max_turns=2" in str(exc)
        return 0.5

    runner = make_runner(agent, policy, max_turns=2)
    try:
        (ep,) = runner([{}])
    finally:
        runner.close()
    assert not ep.failed and ep.truncated and ep.num_turns == 2 and ep.turn_rewards == [0.0, 0.5]


def faulty_agent(release: threading.Event, late_done: threading.Event | None = None):
    """Breaks the way user agents do, chosen by the row's "mode". The "ok" agents wait (bounded) for `late_done`, so
    that the rollout is still under way when the "after_end" agent's leaked thread makes its late request."""
    def agent(task, session):
        mode, client = task["mode"], session.openai()
        chat = [{"role": "user", "content": "Go."}]
        if mode == "no_call":
            return 1.0
        client.chat.completions.create(model=session.model, messages=chat)
        if mode == "raise":
            raise RuntimeError("agent crashed")
        if mode == "hang":
            release.wait()
        if mode == "stall":  # a client that sends half a request and waits for an answer that cannot come
            host, port = session.base_url.removeprefix("http://").split("/")[0].split(":")
            with socket.create_connection((host, int(port))) as stalled:
                key = session.api_key.encode()
                stalled.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nAuthorization: Bearer " + key
                                + b"\r\nContent-Length: 1000\r\n\r\n{")
                release.wait()
        if mode == "malformed":
            post(session.base_url, session.api_key, b"{not json")
        if mode == "bad_role":
            with pytest.raises(openai.BadRequestError, match="messages\\[0\\].role"):
                client.chat.completions.create(model=session.model, messages=[{"role": "wizard", "content": "x"}])
        if mode == "after_end":
            agent_thread = threading.current_thread()

            def late():
                agent_thread.join()  # the episode has ended once its agent's thread is done
                task["late_status"] = post(session.base_url, session.api_key, json.dumps(
                    {"model": "m", "messages": chat}).encode())
                late_done.set()
            task["late"] = threading.Thread(target=late)
            task["late"].start()
        if mode == "ok" and late_done is not None:
            late_done.wait(timeout=120)
        returns = {"nan": float("nan"), "no_reward": None, "turn_rewards": AgentResult(1.0, turn_rewards=[1, 2])}
        return returns.get(mode, 1.0)
    return agent


FAULTS = {"raise": "RuntimeError: agent crashed", "malformed": "not JSON", "bad_role": "messages[0].role",
          "nan": "not all finite", "no_reward": "return a float reward",
          "no_call": "without calling the model", "turn_rewards": "2 turn_rewards for 1 model calls"}


def test_every_fault_fails_its_episode_and_no_other(policy):
    _, tokenizer = policy
    release, late_done = threading.Event(), threading.Event()
    rows = [{"mode": "ok"}, *[{"mode": m} for m in FAULTS], {"mode": "after_end"}, {"mode": "ok"}]
    fine = scripted(tokenizer.encode("fine") + [tokenizer.eos_token_id])
    runner = make_runner(faulty_agent(release, late_done), policy, fine)
    try:
        episodes = runner(rows)
    finally:
        runner.close()
    for row, ep in zip(rows, episodes):
        if row["mode"] in ("ok", "after_end"):  # a late request of a finished episode is refused, its outcome kept
            assert not ep.failed and ep.num_turns == 1 and ep.turn_rewards == [1.0], (row["mode"], ep.failure)
        else:
            assert ep.failed and FAULTS[row["mode"]] in ep.failure, (row["mode"], ep.failure)
    late = next(row for row in rows if row["mode"] == "after_end")
    assert late_done.is_set() and late["late_status"] == 410


def test_a_hung_agent_or_client_fails_at_its_deadline_and_the_others_finish(policy):
    _, tokenizer = policy
    release = threading.Event()
    rows = [{"mode": "ok"}, {"mode": "hang"}, {"mode": "stall"}, {"mode": "ok"}]
    runner = make_runner(faulty_agent(release), policy, scripted(tokenizer.encode("fine") + [tokenizer.eos_token_id]),
                         agent_timeout=8.0)
    try:
        episodes = runner(rows)
        assert [ep.failed for ep in episodes] == [False, True, True, False]
        assert all("agent_timeout=8.0s" in ep.failure for ep in episodes[1:3])
    finally:
        release.set()  # the hung agent's thread goes on and ends; what it asks the endpoint now is refused
        runner.close()
