"""Environment transports side by side: worker processes against Ray actors (one node, two nodes); not a test.

    nice -n 10 python benchmarks/env_transport.py                      # TextWorld, 16 and 64 concurrent episodes
    python benchmarks/env_transport.py --episodes 16 --turns 10 --envs TextWorld no-op
    python benchmarks/env_transport.py --envs ALFWorld --episodes 16 64

No model: each row drives `EnvPool` directly, so that only the environment and its transport show. For each
transport and each number of concurrent episodes, one reset of every episode and then `--turns` batch steps
(every live episode's step at once, one round trip per turn for the batch, as the trainer calls them):

* episodes/s: episodes / (reset + turns steps), the rate a trainer whose generation took no time would see;
* per-turn round trip, median and p99 over the turns: the wall time of one batch step, from submitting every
  episode's call to holding every result;
* driver peak RSS: the peak resident memory of this process (the trainer's place) during the row's start-up and
  timed part (`ru_maxrss`, reset before each row);
* environments' memory: the private memory (USS) of the worker processes or Ray actors, summed, at the end of the
  row (what each adds: pages a forked worker still shares with this process, or an actor with the other actors,
  are not in it); Ray's own processes (GCS, raylets, agents, idle workers) apart, their USS summed.

Environments: TextWorld (generated w2-o3-q4 games), ALFWorld (`--alfworld-games` generated pick_and_place_simple
games, reused across episodes) and a no-op environment (`FaultyEnv` with a target it never reaches: one string
back, the transport's own cost); the command is "look" every turn (a real engine's step). Ray runs on a
`ray.cluster_utils.Cluster` started here (a head and a worker node on this machine); "1 node" pins the actors to
the head with a custom resource, "2 nodes" spreads them. Actor start-up (a Ray worker process importing the
package, once per episode slot, reused across episodes) happens before the timed reset and is reported apart.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from measures import descendants, heading, is_ray_actor, peak_rss_mb, percentile, reset_peak_rss, uss_mb  # noqa: E402
from measures import markdown_table as table  # noqa: E402

from trl_multiturn.rollout import EnvFailure, EnvPool  # noqa: E402
from trl_multiturn.rollout.ray_pool import RayPlacement  # noqa: E402
from trl_multiturn.testing import FaultyEnv  # noqa: E402


def measure(pool: EnvPool, tasks: list[dict], turns: int) -> dict:
    """One timed reset of `tasks` and `turns` batch steps of the episodes still live (the slots already started)."""
    t = time.perf_counter()
    firsts = pool.reset(tasks)
    reset_s = time.perf_counter() - t
    live = [i for i, f in enumerate(firsts) if not isinstance(f, EnvFailure)]
    failed = len(tasks) - len(live)
    rounds = []
    for _ in range(turns):
        t = time.perf_counter()
        results = pool.step(live, ["look"] * len(live))
        rounds.append(time.perf_counter() - t)
        failed += sum(isinstance(r, EnvFailure) for r in results)
        live = [i for i, r in zip(live, results) if not isinstance(r, EnvFailure) and not r.done]
    return {"episodes_per_s": len(tasks) / (reset_s + sum(rounds)), "median_ms": 1000 * statistics.median(rounds),
            "p99_ms": 1000 * percentile(rounds, 0.99), "failed": failed}


def environments_memory(pool: EnvPool) -> dict:
    """The USS of the pool's environment processes summed (MiB) and their number, and the USS of Ray's own
    processes summed (None for the process pool)."""
    if pool.mode != "ray":
        workers = pool.worker_pids()
        return {"envs_mb": uss_mb(workers), "env_processes": len(workers), "ray_mb": None}
    below = descendants()  # the local Ray cluster, its actors included, runs below this process
    actors = [p for p in below if is_ray_actor(p, "_EnvActor")]
    return {"envs_mb": uss_mb(actors), "env_processes": len(actors),
            "ray_mb": uss_mb(p for p in below if p not in actors)}


TRANSPORTS = {
    "process": dict(mode="process"),
    "Ray, 1 node": dict(mode="ray", ray=RayPlacement(num_cpus=0.001, resources={"head_node": 1})),
    "Ray, 2 nodes": dict(mode="ray", ray=RayPlacement(num_cpus=0.001, scheduling="SPREAD")),
}


def textworld(n: int, games: str, **_) -> tuple:
    from trl_multiturn.envs.textworld import TextWorldEnv
    from trl_multiturn.envs.textworld.tasks import textworld_tasks

    rows = list(textworld_tasks(2, 3, 4, split="train", num_games=4, games_dir=games, progress=False))
    return TextWorldEnv, [rows[i % len(rows)] for i in range(n)]


def alfworld(n: int, games: str, alfworld_games: int) -> tuple:
    from trl_multiturn.envs.alfworld import ALFWorldEnv
    from trl_multiturn.envs.alfworld.tasks import alfworld_tasks

    rows = list(alfworld_tasks("train", alfworld_games, ["pick_and_place_simple"], games_dir=games, progress=False))
    return ALFWorldEnv, [rows[i % len(rows)] for i in range(n)]


def no_op(n: int, **_) -> tuple:
    return FaultyEnv, [{"target": 10**9}] * n


ENVS = {"TextWorld": textworld, "ALFWorld": alfworld, "no-op": no_op}


def start_ray_cluster():
    """A head node and a worker node of 2 CPUs each on this machine; returns the cluster (`shutdown()` it)."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"head_node": 1000},
                                                            "include_dashboard": False})
    cluster.add_node(num_cpus=2, resources={"worker_node": 1000})
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    return cluster


def run_row(pool: EnvPool, tasks: list[dict], turns: int) -> dict:
    """One row: start the slots (untimed), the timed reset and turns, then the memory of driver and environments."""
    reset_peak_rss()
    t = time.perf_counter()
    pool.reset(tasks)  # starts the slots' workers or actors; not timed
    startup = time.perf_counter() - t
    row = measure(pool, tasks, turns)
    return {"startup_s": startup, **row, "driver_peak_mb": peak_rss_mb(), **environments_memory(pool)}


COLUMNS = ["environment", "transport", "concurrent episodes", "episodes/s", "per-turn round trip, median", "p99",
           "failed", "first reset (start-up)", "driver peak RSS", "environments' USS, summed (processes)",
           "Ray's own processes' USS"]


def markdown_table(rows: list[dict]) -> str:
    cells = []
    for r in rows:
        head = [r["env"], r["transport"], str(r["episodes"])]
        if "failure" in r:
            cells.append([*head, f"failed: {r['failure']}"])
            continue
        cells.append([*head, f"{r['episodes_per_s']:.1f}", f"{r['median_ms']:.1f} ms", f"{r['p99_ms']:.1f} ms",
                      str(r["failed"]), f"{r['startup_s']:.1f} s", f"{r['driver_peak_mb']:.0f} MiB",
                      f"{r['envs_mb']:.0f} MiB ({r['env_processes']})",
                      "-" if r["ray_mb"] is None else f"{r['ray_mb']:.0f} MiB"])
    return table(COLUMNS, cells, text_columns=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--envs", nargs="+", choices=ENVS, default=["TextWorld"])
    parser.add_argument("--transports", nargs="+", choices=TRANSPORTS, default=list(TRANSPORTS))
    parser.add_argument("--alfworld-games", type=int, default=4, help="ALFWorld games generated, cycled over slots")
    args = parser.parse_args()
    command = f"python {shlex.join(sys.argv)}"  # before game generation, which rewrites sys.argv
    load_at_start = os.getloadavg()[0]

    games = tempfile.mkdtemp(prefix="env-transport-games-")
    envs = {name: ENVS[name](max(args.episodes), games=games, alfworld_games=args.alfworld_games)
            for name in args.envs}
    transports = {name: TRANSPORTS[name] for name in args.transports}
    cluster = start_ray_cluster() if any(t["mode"] == "ray" for t in transports.values()) else None
    rows = []
    try:
        for env_name, (factory, tasks) in envs.items():
            for transport, kwargs in transports.items():
                with EnvPool(factory, timeout=600.0, **kwargs) as pool:
                    for n in sorted(args.episodes):
                        row = {"env": env_name, "transport": transport, "episodes": n}
                        try:
                            row.update(run_row(pool, tasks[:n], args.turns))
                        except Exception as exc:  # noqa: BLE001 - a row that breaks is reported, not hidden
                            row["failure"] = f"{type(exc).__name__}: {exc}"
                        rows.append(row)
                        print(rows[-1], file=sys.stderr, flush=True)
    finally:
        if cluster is not None:
            import ray

            ray.shutdown()
            cluster.shutdown()

    print(heading(command, load_at_start))
    print(f"\nEnvironment transports: {args.turns} batch steps after one reset (everything on this machine: the Ray "
          "nodes share its cores)\n")
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
