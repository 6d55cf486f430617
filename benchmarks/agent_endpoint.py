"""The agent chat endpoint's overhead per turn against calling the generate function directly; not a test.

    nice -n 10 python benchmarks/agent_endpoint.py                    # 16 and 64 concurrent episodes, both backends
    python benchmarks/agent_endpoint.py --episodes 16 --turns 5 --backends scripted

Each row plays `--episodes` agents of `--turns` model calls each, every agent a loop on the real `openai` client
that appends the reply it got and a short user message (so every call after the first joins its episode's sample).
All agents are waiting for the model at every turn (they start together, after a barrier, and `batch_wait` is 60 s,
a bound that the gathering never reaches: a call goes when every episode's request is in), so each turn is one
generate call for every episode (the benchmark checks it). Per turn and episode:

* through the endpoint: the time from the agent's `chat.completions.create` call to its return (HTTP on loopback,
  JSON, the chat template's rendering of the request, the join check, gathering the batch, the generate call,
  parsing the reply);
* overhead: that time minus the wall time of the generate call that served it;
* direct: the wall time of one generate call on the same contexts, as `EpisodeRunner` makes it.

The first turn is reported apart: it also holds the client's one-time costs (its first connection, and the `openai`
package building its response models on first use).

Backends: "scripted" (a generate function that returns 8 fixed tokens at once: the endpoint's own cost alone) and
"tiny model" (a 2-layer random model in-process, `hf_generate_fn`, 8 new tokens greedy: a real, small generate
call). Median and p99 (nearest rank) over every turn of every episode.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from measures import heading, percentile  # noqa: E402
from measures import markdown_table as table  # noqa: E402

from trl_multiturn.agents import AgentEnvironment, AgentRunner  # noqa: E402
from trl_multiturn.rollout.rules import EpisodeRules

NEW_TOKENS = 8


class Timed:
    """A generate function that records the wall time of each call and the contexts it was given."""

    def __init__(self, generate):
        self.generate, self.seconds, self.contexts = generate, [], []

    def __call__(self, contexts, max_new_tokens):
        t = time.perf_counter()
        out = self.generate(contexts, max_new_tokens)
        self.seconds.append(time.perf_counter() - t)
        self.contexts.append(contexts)
        return out


def looping_agent(turns: int, latencies: dict, start: threading.Barrier):
    def agent(task, session):
        client = session.openai()
        start.wait()  # every agent's thread and client made: the first turn times requests, not thread start-up
        messages = [{"role": "user", "content": f"Task {task['i']}: explore."}]
        own = latencies.setdefault(task["i"], [])
        for k in range(turns):
            t = time.perf_counter()
            reply = client.chat.completions.create(model=session.model, messages=messages, max_tokens=NEW_TOKENS)
            own.append(time.perf_counter() - t)
            messages += [reply.choices[0].message.model_dump(exclude_none=True),
                         {"role": "user", "content": f"You see room {k}."}]
        return 1.0
    return agent


def backends(names: list[str]):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_multiturn.rollout.generation import hf_generate_fn
    from trl_multiturn.testing import build_tiny_model

    path = build_tiny_model(tempfile.mkdtemp(prefix="agent-endpoint-bench-"), template="chatml")
    tokenizer = AutoTokenizer.from_pretrained(path)
    fixed = tokenizer.encode("go north now", add_special_tokens=False)[: NEW_TOKENS - 1] + [tokenizer.eos_token_id]
    made = {"scripted": lambda: lambda contexts, n: ([fixed[:n] for _ in contexts], None)}
    if "tiny model" in names:
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        made["tiny model"] = lambda: hf_generate_fn(model, tokenizer, batch_size=64)
    return tokenizer, {name: made[name] for name in names}


def row(tokenizer, make_generate, episodes: int, turns: int) -> dict:
    latencies: dict[int, list[float]] = {}
    endpoint_gen = Timed(make_generate())
    start = threading.Barrier(episodes, timeout=600)
    runner = AgentRunner(AgentEnvironment(looping_agent(turns, latencies, start), batch_wait=60.0), tokenizer,
                         endpoint_gen, EpisodeRules(max_turns=turns, max_completion_length=NEW_TOKENS))
    try:
        played = runner([{"i": i} for i in range(episodes)])
    finally:
        runner.close()
    failed = sum(ep.failed for ep in played)
    if [len(c) for c in endpoint_gen.contexts] != [episodes] * turns:
        raise RuntimeError(f"the turns were not one generate call each: {[len(c) for c in endpoint_gen.contexts]}")
    through = [lat[k] for lat in latencies.values() for k in range(1, turns)]
    overhead = [lat[k] - endpoint_gen.seconds[k] for lat in latencies.values() for k in range(1, turns)]
    first = [lat[0] - endpoint_gen.seconds[0] for lat in latencies.values()]
    direct_gen = Timed(make_generate())
    for contexts in endpoint_gen.contexts[1:]:  # the same contexts, straight to the generate function
        direct_gen(contexts, NEW_TOKENS)
    direct = [s for s in direct_gen.seconds for _ in range(episodes)]
    return {"through": through, "overhead": overhead, "direct": direct, "first": first, "failed": failed,
            "joined": runner.last_stats["joined"]}


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--backends", nargs="+", default=["scripted", "tiny model"],
                        choices=["scripted", "tiny model"])
    args = parser.parse_args()
    load = os.getloadavg()[0]
    tokenizer, made = backends(args.backends)
    rows = []
    for name, make_generate in made.items():
        for n in args.episodes:
            r = row(tokenizer, make_generate, n, args.turns)
            rows.append([name, str(n), ms(statistics.median(r["direct"])), ms(percentile(r["direct"], 0.99)),
                         ms(statistics.median(r["through"])), ms(percentile(r["through"], 0.99)),
                         ms(statistics.median(r["overhead"])), ms(percentile(r["overhead"], 0.99)),
                         ms(statistics.median(r["first"])), f"{r['joined']}/{n * (args.turns - 1)}", str(r["failed"])])
            print(rows[-1], file=sys.stderr, flush=True)
    command = "python benchmarks/agent_endpoint.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    print(heading(command.strip(), load))
    print()
    print(f"{args.turns} turns per episode, {NEW_TOKENS} new tokens per reply; per turn and episode, turns 2 to "
          f"{args.turns} (the first turn's overhead apart).\n")
    print(table(["backend", "concurrent episodes", "direct, median", "p99", "through the endpoint, median", "p99",
                 "overhead, median", "p99", "first turn's overhead, median", "joined", "failed"], rows,
                text_columns=1))


if __name__ == "__main__":
    main()
