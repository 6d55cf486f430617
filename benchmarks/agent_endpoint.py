"""The agent endpoint's overhead per turn against calling the generate function directly; not a test.

    nice -n 10 python benchmarks/agent_endpoint.py          # 16 and 64 episodes, both backends, every dialect
    python benchmarks/agent_endpoint.py --episodes 16 --turns 5 --backends scripted --dialects chat
    python benchmarks/agent_endpoint.py --agents thread process       # agents in their own processes, beside threads
    python benchmarks/agent_endpoint.py --mini-swe-agent 4            # mini-swe-agent's seconds per SWE-Gym episode

Each row plays `--episodes` agents of `--turns` model calls each in one dialect, streamed or not: every agent a loop
on the real client (`openai` for chat completions and the Responses API, `anthropic` for the Messages API) that
appends the reply it got and a short user message (so every call after the first joins its episode's sample; a
streamed reply is read event by event). All agents are waiting for the model at every turn (they start together,
after a barrier, and `batch_wait` is 60 s, a bound that the gathering never reaches: a call goes when every episode's
request is in), so each turn is one generate call for every episode (the benchmark checks it). Per turn and episode:

* through the endpoint: the time from the agent's `chat.completions.create` call to its return (HTTP on loopback,
  JSON, the chat template's rendering of the request, the join check, gathering the batch, the generate call,
  parsing the reply);
* overhead: that time minus the wall time of the generate call that served it;
* direct: the wall time of one generate call on the same contexts, as `EpisodeRunner` makes it.

The first turn is reported apart: it also holds the client's one-time costs (its first connection, and the `openai`
package building its response models on first use).

The batch_wait table plays the chat dialect with the default `batch_wait` (a call goes when every episode has a
request in, or none arrived for that long) and counts the generate calls per turn: more than 1.0 is a turn split into
several calls.

With `--agents`, one table instead: each dialect, streamed and not, played by thread agents (the loop above) and by
process agents (the same loop, `agent_loops.py`, in its own Python process per episode: `AgentCommand` running
`benchmarks/process_agent.py`, its client configured by its environment; its first turn also waits for every
process to start and import its client), row beside row in one run.

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
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from agent_loops import DIALECTS, NEW_TOKENS  # noqa: E402
from measures import heading, percentile  # noqa: E402
from measures import markdown_table as table  # noqa: E402

from trl_multiturn.agents import AgentCommand, AgentEnvironment, AgentRunner  # noqa: E402
from trl_multiturn.rollout.rules import EpisodeRules  # noqa: E402


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


def client_of(dialect: str, session):
    return session.anthropic() if dialect == "messages" else session.openai()


def looping_agent(dialect: str, stream: bool, turns: int, latencies: dict, start: threading.Barrier):
    def agent(task, session):
        session = SimpleNamespace(client=client_of(dialect, session), model=session.model)
        start.wait()  # every agent's thread and client made: the first turn times requests, not thread start-up
        history = [{"role": "user", "content": f"Task {task['i']}: explore."}]
        own = latencies.setdefault(task["i"], [])
        for k in range(turns):
            t = time.perf_counter()
            reply = DIALECTS[dialect](session, history, stream)
            own.append(time.perf_counter() - t)
            history += reply + [{"role": "user", "content": f"You see room {k}."}]
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


def row(tokenizer, make_generate, episodes: int, turns: int, dialect: str = "chat", stream: bool = False,
        batch_wait: float = 60.0, agents: str = "thread") -> dict:
    latencies: dict[int, list[float]] = {}
    endpoint_gen = Timed(make_generate())
    if agents == "thread":
        agent = looping_agent(dialect, stream, turns, latencies, threading.Barrier(episodes, timeout=600))
    else:  # the same loop in a process per episode
        agent = AgentCommand([sys.executable, os.path.join(os.path.dirname(__file__), "process_agent.py"), str(turns),
                              dialect, "stream" if stream else "whole"])
    runner = AgentRunner(AgentEnvironment(agent, batch_wait=batch_wait), tokenizer, endpoint_gen,
                         EpisodeRules(max_turns=turns, max_completion_length=NEW_TOKENS))
    try:
        played = runner([{"i": i} for i in range(episodes)])
    finally:
        runner.close()
    failures = [ep.failure for ep in played if ep.failed]
    if failures:
        raise RuntimeError(f"{len(failures)} episodes failed: {failures[0]}")
    if agents == "process":
        latencies = {ep.task["i"]: ep.turns[-1].info["latencies"] for ep in played}
    calls = [len(c) for c in endpoint_gen.contexts]
    if batch_wait == 60.0 and calls != [episodes] * turns:
        raise RuntimeError(f"the turns were not one generate call each: {calls}")
    # the wall time of the generate call that served each context (a turn split into calls: each its own)
    spent = {tuple(c): s for s, contexts in zip(endpoint_gen.seconds, endpoint_gen.contexts) for c in contexts}
    served = {i: [spent[tuple(c)] for c in contexts] for i, contexts in _contexts_by_episode(played).items()}
    through = [lat[k] for lat in latencies.values() for k in range(1, turns)]
    overhead = [latencies[i][k] - served[i][k] for i in latencies for k in range(1, turns)]
    first = [latencies[i][0] - served[i][0] for i in latencies]
    direct_gen = Timed(make_generate())
    for contexts in endpoint_gen.contexts[1:]:  # the same contexts, straight to the generate function
        direct_gen(contexts, NEW_TOKENS)
    direct = [s for s, c in zip(direct_gen.seconds, endpoint_gen.contexts[1:]) for _ in c]
    return {"through": through, "overhead": overhead, "direct": direct, "first": first,
            "joined": runner.last_stats["joined"], "calls_per_turn": len(calls) / turns}


def _contexts_by_episode(played) -> dict[int, list[list[int]]]:
    """Each episode's (by task index) model contexts, turn by turn, as its trajectory holds them."""
    return {ep.task["i"]: [ep.prompt_ids + ep.completion_ids[:start] for start, _ in ep.turn_spans]
            for ep in played}


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--backends", nargs="+", default=["scripted", "tiny model"],
                        choices=["scripted", "tiny model"])
    parser.add_argument("--dialects", nargs="+", default=list(DIALECTS), choices=list(DIALECTS))
    parser.add_argument("--agents", nargs="+", choices=["thread", "process"],
                        help="instead: thread and/or process agents side by side, each dialect streamed and not")
    parser.add_argument("--mini-swe-agent", type=int, default=0, metavar="N",
                        help="instead: mini-swe-agent on N shipped SWE-Gym tasks, one episode at a time")
    args = parser.parse_args()
    if args.mini_swe_agent:
        return mini_swe_agent_table(args.mini_swe_agent)
    if args.agents:
        return agents_table(args)
    load = os.getloadavg()[0]
    tokenizer, made = backends(args.backends)
    rows, waits = [], []
    for name, make_generate in made.items():
        for n in args.episodes:
            for dialect in args.dialects:
                for stream in (False, True):
                    r = row(tokenizer, make_generate, n, args.turns, dialect, stream)
                    rows.append([name, str(n), dialect, "yes" if stream else "no", *timing_cells(r, n, args.turns)])
                    print(rows[-1], file=sys.stderr, flush=True)
            default_wait = AgentEnvironment(lambda task, session: 0.0).batch_wait
            r = row(tokenizer, make_generate, n, args.turns, batch_wait=default_wait)
            waits.append([name, str(n), f"{r['calls_per_turn']:.2f}", ms(statistics.median(r["overhead"])),
                          ms(percentile(r["overhead"], 0.99)), ms(statistics.median(r["through"]))])
            print(waits[-1], file=sys.stderr, flush=True)
    print_heading(load, f"{args.turns} turns per episode, {NEW_TOKENS} new tokens per reply; per turn and episode, "
                        f"turns 2 to {args.turns} (the first turn's overhead apart); thread agents.")
    print(table(["backend", "concurrent episodes", "dialect", "streamed", "direct, median", "p99",
                 "through the endpoint, median", "p99", "overhead, median", "p99", "first turn's overhead, median",
                 "joined"], rows, text_columns=4))
    print(f"\nThe default batch_wait ({default_wait} s: a call goes when every episode has a request in, or none came "
          f"for {default_wait} s), chat dialect, not streamed:\n")
    print(table(["backend", "concurrent episodes", "generate calls per turn", "overhead, median", "p99",
                 "through the endpoint, median"], waits, text_columns=1))


def print_heading(load: float, setting: str) -> None:
    """The table's heading (the command that made it, the load) and a line saying what was measured."""
    command = "python benchmarks/agent_endpoint.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    print(heading(command.strip(), load))
    print()
    print(setting + "\n")


def timing_cells(r: dict, episodes: int, turns: int) -> list[str]:
    """A row's timing columns: direct, through the endpoint and overhead (median, p99), the first turn's overhead,
    and the turns joined."""
    cells = []
    for key in ("direct", "through", "overhead"):
        cells += [ms(statistics.median(r[key])), ms(percentile(r[key], 0.99))]
    return [*cells, ms(statistics.median(r["first"])), f"{r['joined']}/{episodes * (turns - 1)}"]


def agents_table(args) -> None:
    """Thread and process agents (`--agents`), each dialect streamed and not, in one run."""
    load = os.getloadavg()[0]
    tokenizer, made = backends(args.backends)
    rows = []
    for name, make_generate in made.items():
        for n in args.episodes:
            for dialect in args.dialects:
                for stream in (False, True):
                    for agents in args.agents:
                        r = row(tokenizer, make_generate, n, args.turns, dialect, stream, agents=agents)
                        rows.append([name, agents, str(n), dialect, "yes" if stream else "no",
                                     *timing_cells(r, n, args.turns)])
                        print(rows[-1], file=sys.stderr, flush=True)
    print_heading(load, f"{args.turns} turns per episode, {NEW_TOKENS} new tokens per reply; per turn and episode, "
                        f"turns 2 to {args.turns} (the first turn's overhead apart).")
    print(table(["backend", "agents", "concurrent episodes", "dialect", "streamed", "direct, median", "p99",
                 "through the endpoint, median", "p99", "overhead, median", "p99", "first turn's overhead, median",
                 "joined"], rows, text_columns=5))


def mini_swe_agent_table(count: int) -> None:
    """mini-swe-agent (`trl_multiturn.agents.mini_swe_agent`, its own mini.yaml) on the first `count` shipped SWE-Gym
    tasks, one episode at a time, served by the tiny random model (8 new tokens a reply: it makes no tool call, so
    mini stops after its 3 format errors; then the diff is graded): each episode's wall seconds (the sandbox's start,
    the agent's run, the grading) and the part of them spent in generate calls."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_multiturn.agents.mini_swe_agent import mini_swe_agent_environment
    from trl_multiturn.envs.swegym import SWEGymConfig, load_tasks
    from trl_multiturn.rollout.generation import hf_generate_fn
    from trl_multiturn.testing import build_tiny_model

    load = os.getloadavg()[0]
    path = build_tiny_model(tempfile.mkdtemp(prefix="agent-endpoint-bench-"), template="chatml")
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()
    generate = Timed(hf_generate_fn(model, tokenizer))
    rows = []
    for task in list(load_tasks())[:count]:
        runner = AgentRunner(mini_swe_agent_environment(SWEGymConfig(reward="dense")), tokenizer, generate,
                             EpisodeRules(max_turns=8, max_completion_length=NEW_TOKENS))
        calls = len(generate.seconds)
        t = time.perf_counter()
        try:
            (ep,) = runner([task])
        finally:
            runner.close()
        seconds = time.perf_counter() - t
        info = ep.turns[-1].info if not ep.failed else {}
        rows.append([task["instance_id"], f"{seconds:.1f} s", f"{sum(generate.seconds[calls:]):.2f} s",
                     str(ep.num_turns), info.get("exit_status", ep.failure or ""),
                     f"{info.get('f2p_passed', 0)}/{info.get('f2p_total', 0)}"])
        print(rows[-1], file=sys.stderr, flush=True)
    command = "python benchmarks/agent_endpoint.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    print(heading(command.strip(), load))
    print()
    print(table(["task", "episode", "generate calls", "model calls", "mini's exit", "FAIL_TO_PASS passing"], rows,
                text_columns=1))


if __name__ == "__main__":
    main()
