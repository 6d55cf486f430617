"""TextWorld or ALFWorld through OpenEnv's transport against the trainers' own process pool; not a test.

    nice -n 15 python benchmarks/env_transport_openenv.py                        # a few minutes on 2 shared cores
    python benchmarks/env_transport_openenv.py --concurrency 16 64 256 --episodes-per-slot 3
    python benchmarks/env_transport_openenv.py --env alfworld --concurrency 16

Every episode plays the walkthrough of one game (reset, then its winning steps), no model: what the environment
transport alone costs. TextWorld (`--env textworld`): 8 generated w2-o3-q4 games, 4-6 steps each; ALFWorld
(`--env alfworld`): `--alfworld-games` generated pick_and_place_simple games, their stored expert walkthroughs.
Rows:

* "process pool": `EnvPool(<the environment>)` in the trainers' default mode, a worker process per episode slot;
* "OpenEnv": `EnvPool(OpenEnvEnvironment)` (a thread per call, as the trainers run it) against one
  `trl-multiturn serve --env <name>` on loopback (`LocalServer`), which runs each session's environment in a worker
  process of its own. Same engine, same worker processes; the difference is the WebSocket round trip and the server.

At each concurrency C, C episodes run at once, `--episodes-per-slot` after one another. Per-turn round trip: the
wall time of one batched `step` of the C live episodes (what a trainer waits for after each generate call), median
and p99 over every turn of the run; "single call" is the same with C = 1 (one episode's step, transport included).
Episodes/s: C x episodes-per-slot over the whole run's wall time, resets included (the first reset of a slot
starts its worker: not timed, a warm-up round runs first). Memory: this process's peak RSS during the row
(`ru_maxrss`, reset before each row; it holds the pool and, for OpenEnv, the client threads) and, at the row's end,
the private memory (USS) summed of the environments' worker processes (the pool's, or the server's sessions':
what each adds beside the pages it shares with the process it was forked from), and the resident memory (RSS) of
the OpenEnv server process itself (the pages its session workers share with it included).
"""

from __future__ import annotations

import argparse
import functools
import os
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from measures import descendants, heading, peak_rss_mb, percentile, reset_peak_rss, uss_mb  # noqa: E402
from measures import markdown_table as table  # noqa: E402

from trl_multiturn.commands.serve import LocalServer  # noqa: E402
from trl_multiturn.envs.openenv import OpenEnvEnvironment  # noqa: E402
from trl_multiturn.rollout.env_pool import EnvFailure, EnvPool  # noqa: E402


@dataclass
class Served:
    """One environment as both sides play it: its `serve --env` name, its keyword arguments (`--option` on the
    server), its class for the process pool, and the task rows the slots cycle over."""

    name: str
    options: dict
    env_class: type
    rows: list[dict]


def textworld(games_dir: str, **_) -> Served:
    from trl_multiturn.envs import TextWorldEnv

    rows = [{"world_size": 2, "nb_objects": 3, "quest_length": 4, "seed": seed} for seed in range(8)]
    return Served("textworld", {"games_dir": games_dir}, TextWorldEnv, rows)


def alfworld(games_dir: str, alfworld_games: int) -> Served:
    from trl_multiturn.envs import ALFWorldEnv
    from trl_multiturn.envs.alfworld.tasks import alfworld_tasks

    rows = list(alfworld_tasks("train", alfworld_games, ["pick_and_place_simple"], games_dir=games_dir,
                               progress=False))
    return Served("alfworld", {}, ALFWorldEnv, rows)


ENVS = {"textworld": textworld, "alfworld": alfworld}


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


def measure(name: str, factory, memory, served: Served, concurrency: int, rounds: int) -> dict:
    """One row: `concurrency` slots of `factory` play `rounds` walkthroughs each after a warm-up round; `memory(pool)`
    gives (the environments' processes, the server's RSS in MiB or None) at the end."""
    tasks = [served.rows[i % len(served.rows)] for i in range(concurrency)]
    local = served.env_class(**served.options)
    walkthroughs = [local.expert_actions(task) for task in tasks]
    local.close()
    reset_peak_rss()
    with EnvPool(factory) as pool:
        play(pool, tasks, walkthroughs, 1)  # warm-up: workers and sessions started, games loaded
        wall, turns = play(pool, tasks, walkthroughs, rounds)
        env_processes, server_mb = memory(pool)
        envs_mb = uss_mb(env_processes)  # while they live
    return {"transport": name, "concurrency": concurrency, "episodes": concurrency * rounds,
            "median_ms": 1000 * statistics.median(turns), "p99_ms": 1000 * percentile(turns, 0.99),
            "episodes_per_s": concurrency * rounds / wall, "driver_peak_mb": peak_rss_mb(),
            "envs_mb": envs_mb, "env_processes": len(env_processes),
            "server_rss_mb": server_mb}


COLUMNS = ["transport", "concurrent episodes", "episodes", "per-turn round trip, median (ms)", "p99 (ms)",
           "episodes/s", "driver peak RSS (MiB)", "environments' USS, summed (MiB) (processes)", "server's RSS (MiB)"]


def markdown_table(rows: list[dict], title: str) -> str:
    cells = []
    for r in rows:
        head = [r["transport"], "1 (single call)" if r["concurrency"] == 1 else str(r["concurrency"])]
        if "failure" in r:
            cells.append([*head, f"failed: {r['failure']}"])
            continue
        cells.append([*head, str(r["episodes"]), f"{r['median_ms']:.1f}", f"{r['p99_ms']:.1f}",
                      f"{r['episodes_per_s']:.2f}", f"{r['driver_peak_mb']:.0f}",
                      f"{r['envs_mb']:.0f} ({r['env_processes']})",
                      "-" if r["server_rss_mb"] is None else f"{r['server_rss_mb']:.0f}"])
    return f"{title}\n\n{table(COLUMNS, cells)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", choices=ENVS, default="textworld")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--episodes-per-slot", type=int, default=2)
    parser.add_argument("--games-dir", default=None, help="Game cache (default: a temporary folder).")
    parser.add_argument("--alfworld-games", type=int, default=4, help="ALFWorld games generated, cycled over slots.")
    parser.add_argument("--message-timeout", type=float, default=600.0,
                        help="Seconds the OpenEnv client waits for one reply before the call fails (OpenEnvConfig).")
    parser.add_argument("--out", type=Path, default=None, help="Also write the table to this Markdown file.")
    args = parser.parse_args()
    command = f"python {shlex.join(sys.argv)}"  # before ALFWorld's game generation, which rewrites sys.argv
    load_at_start = os.getloadavg()[0]
    served = ENVS[args.env](args.games_dir or tempfile.mkdtemp(prefix=f"{args.env}-games-"),
                            alfworld_games=args.alfworld_games)
    rows = []
    with LocalServer(served.name, served.options, "--max-sessions", str(max(args.concurrency))) as server:
        remote = functools.partial(OpenEnvEnvironment, base_url=server.url,
                                   message_timeout=args.message_timeout)
        sides = {
            "process pool": (functools.partial(served.env_class, **served.options),
                             lambda pool: (pool.worker_pids(), None)),
            "OpenEnv": (remote, lambda pool: (descendants(server.process.pid),
                                              psutil.Process(server.process.pid).memory_info().rss / 2**20)),
        }
        for concurrency in [1, *args.concurrency]:
            for name, (factory, memory) in sides.items():
                try:
                    rows.append(measure(name, factory, memory, served, concurrency, args.episodes_per_slot))
                except RuntimeError as exc:  # a row whose episodes failed is reported, not hidden
                    rows.append({"transport": name, "concurrency": concurrency, "failure": str(exc)})
                print(rows[-1], file=sys.stderr, flush=True)
    table = markdown_table(rows, heading(command, load_at_start))
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
