"""Environment transports side by side: worker processes against Ray actors (one node, two nodes); not a test.

    nice -n 10 python benchmarks/env_transport.py                      # TextWorld, 16 and 64 concurrent episodes
    python benchmarks/env_transport.py --episodes 16 --turns 10 --envs TextWorld no-op

No model: each row drives `EnvPool` directly, so that only the environment and its transport show. For each
transport and each number of concurrent episodes, one reset of every episode and then `--turns` batch steps
(every live episode's step at once, one round trip per turn for the batch, as the trainer calls them):

* episodes/s: episodes / (reset + turns steps), the rate a trainer whose generation took no time would see;
* per-turn round trip, median and p99 over the turns: the wall time of one batch step, from submitting every
  episode's call to holding every result.

Environments: TextWorld (generated w2-o3-q4 games, the command "look" every turn: a real engine's step) and a no-op
environment (`FaultyEnv` with a target it never reaches: one string back, the transport's own cost). Ray runs on a
`ray.cluster_utils.Cluster` started here (a head and a worker node on this machine); "1 node" pins the actors to
the head with a custom resource, "2 nodes" spreads them. Actor start-up (a Ray worker process importing the
package, once per episode slot, reused across episodes) happens before the timed reset and is reported apart.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from trl_multiturn.rollout import EnvFailure, EnvPool  # noqa: E402
from trl_multiturn.rollout.ray_pool import RayPlacement  # noqa: E402
from trl_multiturn.testing import FaultyEnv  # noqa: E402


def p99(values: list[float]) -> float:
    """The 99th percentile, nearest rank: the ceil(0.99 n)-th smallest value (the largest when n < 100)."""
    ordered = sorted(values)
    return ordered[max(0, -(-99 * len(ordered) // 100) - 1)]


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
            "p99_ms": 1000 * p99(rounds), "failed": failed}


TRANSPORTS = {
    "process": dict(mode="process"),
    "Ray, 1 node": dict(mode="ray", ray=RayPlacement(num_cpus=0.001, resources={"head_node": 1})),
    "Ray, 2 nodes": dict(mode="ray", ray=RayPlacement(num_cpus=0.001, scheduling="SPREAD")),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--envs", nargs="+", choices=("TextWorld", "no-op"), default=["TextWorld"])
    parser.add_argument("--transports", nargs="+", choices=TRANSPORTS, default=list(TRANSPORTS))
    args = parser.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    from trl_multiturn.envs.textworld import TextWorldEnv
    from trl_multiturn.envs.textworld.tasks import textworld_tasks

    games = tempfile.mkdtemp(prefix="env-transport-games-")
    game_rows = list(textworld_tasks(2, 3, 4, split="train", num_games=4, games_dir=games, progress=False))
    most = max(args.episodes)
    envs = {"TextWorld": (TextWorldEnv, [game_rows[i % len(game_rows)] for i in range(most)]),
            "no-op": (FaultyEnv, [{"target": 10**9}] * most)}
    envs = {name: envs[name] for name in args.envs}

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"head_node": 1000},
                                                            "include_dashboard": False})
    cluster.add_node(num_cpus=2, resources={"worker_node": 1000})
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    transports = {name: TRANSPORTS[name] for name in args.transports}
    rows = []
    try:
        for env_name, (factory, tasks) in envs.items():
            for transport, kwargs in transports.items():
                with EnvPool(factory, timeout=600.0, **kwargs) as pool:
                    for n in sorted(args.episodes):
                        t = time.perf_counter()
                        pool.reset(tasks[:n])  # starts the slots' workers or actors; not timed
                        startup = time.perf_counter() - t
                        row = measure(pool, tasks[:n], args.turns)
                        rows.append({"env": env_name, "transport": transport, "episodes": n, "startup_s": startup,
                                     **row})
                        print(rows[-1], flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()

    print(f"\nEnvironment transports: {args.turns} batch steps after one reset, {os.cpu_count()} CPU cores "
          "(everything on this machine: the Ray nodes share its cores)\n")
    print("| environment | transport | concurrent episodes | episodes/s | per-turn round trip, median | p99 | "
          "failed | first reset (start-up) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['env']} | {r['transport']} | {r['episodes']} | {r['episodes_per_s']:.1f} | "
              f"{r['median_ms']:.1f} ms | {r['p99_ms']:.1f} ms | {r['failed']} | {r['startup_s']:.1f} s |")


if __name__ == "__main__":
    main()
