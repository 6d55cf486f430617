"""TextWorld through OpenEnv's transport against the trainers' own process pool; not a test.

    nice -n 15 python benchmarks/env_transport_openenv.py                        # a few minutes on 2 shared cores
    python benchmarks/env_transport_openenv.py --concurrency 16 64 256 --episodes-per-slot 3

Every episode plays the walkthrough of one of 8 generated w2-o3-q4 games (reset, then its 4-6 winning steps), no
model: what the environment transport alone costs. Rows:

* "process pool": `EnvPool(TextWorldEnv)` in the trainers' default mode, a worker process per episode slot;
* "OpenEnv": `EnvPool(OpenEnvEnvironment)` (a thread per call, as the trainers run it) against one
  `trl-multiturn serve --env textworld` on loopback (`LocalServer`), which runs each session's TextWorld in a worker
  process of its own. Same engine, same worker processes; the difference is the WebSocket round trip and the server.

At each concurrency C, C episodes run at once, `--episodes-per-slot` after one another. Per-turn round trip: the
wall time of one batched `step` of the C live episodes (what a trainer waits for after each generate call), median
and p99 over every turn of the run; "single call" is the same with C = 1 (one episode's step, transport included).
Episodes/s: C x episodes-per-slot over the whole run's wall time, resets included (the first reset of a slot
starts its worker: not timed, a warm-up round runs first).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from trl_multiturn.commands.serve import LocalServer  # noqa: E402
from trl_multiturn.envs import TextWorldEnv  # noqa: E402
from trl_multiturn.envs.openenv import OpenEnvEnvironment  # noqa: E402
from trl_multiturn.rollout.env_pool import EnvFailure, EnvPool  # noqa: E402

TASK = {"world_size": 2, "nb_objects": 3, "quest_length": 4}


def percentile(values: list[float], q: float) -> float:
    """The `q`-quantile of `values` by the nearest rank: the value at rank ceil(q * n) of the sorted values."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def play(pool: EnvPool, tasks: list[dict], walkthroughs: list[list[str]], rounds: int) -> tuple[float, list[float]]:
    """Play `rounds` episodes on every slot of `pool`; (wall time, per-turn batched step times). Turn k steps the
    episodes whose walkthrough is still going."""
    turns = []
    start = time.perf_counter()
    for _ in range(rounds):
        firsts = pool.reset(tasks)
        failed = [f.reason for f in firsts if isinstance(f, EnvFailure)]
        if failed:
            raise RuntimeError(f"{len(failed)} resets failed: {failed[0]}")
        won = 0
        for k in range(max(map(len, walkthroughs))):
            live = [slot for slot, walkthrough in enumerate(walkthroughs) if k < len(walkthrough)]
            turn_start = time.perf_counter()
            results = pool.step(live, [walkthroughs[slot][k] for slot in live])
            turns.append(time.perf_counter() - turn_start)
            failed = [r.reason for r in results if isinstance(r, EnvFailure)]
            if failed:
                raise RuntimeError(f"{len(failed)} steps failed: {failed[0]}")
            won += sum(r.won for r in results)
        if won != len(tasks):
            raise RuntimeError(f"{len(tasks) - won} walkthroughs did not win")
    return time.perf_counter() - start, turns


def measure(name: str, factory, concurrency: int, rounds: int, games_dir: str) -> dict:
    tasks = [{**TASK, "seed": i % 8} for i in range(concurrency)]
    local = TextWorldEnv(games_dir=games_dir)
    walkthroughs = [local.expert_actions(task) for task in tasks]
    local.close()
    with EnvPool(factory) as pool:
        play(pool, tasks, walkthroughs, 1)  # warm-up: workers and sessions started, games loaded
        wall, turns = play(pool, tasks, walkthroughs, rounds)
    return {"transport": name, "concurrency": concurrency, "episodes": concurrency * rounds,
            "median_ms": 1000 * statistics.median(turns), "p99_ms": 1000 * percentile(turns, 0.99),
            "episodes_per_s": concurrency * rounds / wall}


def markdown_table(rows: list[dict], command: str) -> str:
    lines = [f"# {command}  ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, load average "
             f"{os.getloadavg()[0]:.1f} at the end)", "",
             "| transport | concurrent episodes | episodes | per-turn round trip, median (ms) | p99 (ms) "
             "| episodes/s |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        label = "1 (single call)" if r["concurrency"] == 1 else str(r["concurrency"])
        if "failure" in r:
            lines.append(f"| {r['transport']} | {label} | failed: {r['failure']} | | | |")
            continue
        lines.append(f"| {r['transport']} | {label} | {r['episodes']} | {r['median_ms']:.1f} | {r['p99_ms']:.1f} | "
                     f"{r['episodes_per_s']:.2f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--episodes-per-slot", type=int, default=2)
    parser.add_argument("--games-dir", default=None, help="Game cache (default: a temporary folder).")
    parser.add_argument("--out", type=Path, default=None, help="Also write the table to this Markdown file.")
    args = parser.parse_args()
    games_dir = args.games_dir or tempfile.mkdtemp(prefix="tw-games-")
    rows = []
    with LocalServer("textworld", {"games_dir": games_dir}, "--max-sessions", str(max(args.concurrency))) as server:
        remote = functools.partial(OpenEnvEnvironment, base_url=server.url, message_timeout=600)
        local = functools.partial(TextWorldEnv, games_dir=games_dir)
        for concurrency in [1, *args.concurrency]:
            for name, factory in (("process pool", local), ("OpenEnv", remote)):
                try:
                    rows.append(measure(name, factory, concurrency, args.episodes_per_slot, games_dir))
                except RuntimeError as exc:  # a row whose episodes failed is reported, not hidden
                    rows.append({"transport": name, "concurrency": concurrency, "failure": str(exc)})
                print(rows[-1], file=sys.stderr, flush=True)
    table = markdown_table(rows, f"python {' '.join(sys.argv)}")
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
