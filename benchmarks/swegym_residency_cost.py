"""What making every page of a Docker sandbox's files resident costs per start (`sandbox/residency.py`), and what
copying the image's content of its writable folders into their tmpfs mounts costs (`DockerSandbox._fill_writable`).

    python benchmarks/swegym_residency_cost.py [--starts 6]   # as root, beside the engine (DOCKER_HOST)

Starts `--starts` Docker sandboxes of `roman` one after another and prints, per start, the wall time and the CPU
time (this process's, all its threads) that reading the container's files took, the wall time of the copy and of
the whole start, and their medians.
"""

from __future__ import annotations

import argparse
import statistics
import time

from trl_multiturn.envs.swegym import SandboxConfig, make_sandbox, task_rows
from trl_multiturn.envs.swegym.sandbox import docker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--starts", type=int, default=6)
    args = parser.parse_args()
    row = next(r for r in task_rows() if r["repo"].endswith("/roman"))
    walls, cpus, copies, starts = [], [], [], []
    make_resident, fill_writable = docker.make_resident, docker.DockerSandbox._fill_writable

    def timed(root: int) -> int:
        wall, cpu = time.perf_counter(), time.process_time()
        read = make_resident(root)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
        return read

    def timed_fill(sandbox) -> None:
        wall = time.perf_counter()
        fill_writable(sandbox)
        copies.append(time.perf_counter() - wall)

    docker.make_resident, docker.DockerSandbox._fill_writable = timed, timed_fill
    for _ in range(args.starts):
        with make_sandbox(SandboxConfig(sandbox="docker")) as sandbox:
            wall = time.perf_counter()
            sandbox.start(row)
            starts.append(time.perf_counter() - wall)
    for name, values in (("wall", walls), ("cpu", cpus), ("copy wall", copies), ("start wall", starts)):
        print(f"{name} s: {[round(v, 2) for v in values]}, median {statistics.median(values):.2f}")


if __name__ == "__main__":
    main()
