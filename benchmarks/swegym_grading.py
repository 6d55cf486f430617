"""Grading time of the shipped SWE-Gym tasks with their gold patch, per sandbox backend; not a test.

    nice -n 10 python benchmarks/swegym_grading.py                    # local (bubblewrap) sandbox
    nice -n 10 python benchmarks/swegym_grading.py --sandbox docker   # Docker (starts dockerd as tests do)

Each of the 12 shipped tasks is graded once with its gold patch (`grade_patch`: the real run and the twin run, each
in a fresh sandbox), after one warm-up grading that builds the repositories, the task Python or the images. The
table gives each task's wall time and verdict, then the median over the tasks and how many resolved.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sandbox", choices=("local", "docker"), default="local")
    args = parser.parse_args()
    from trl_multiturn.envs.swegym import SWEGymConfig, grade_patch, task_rows

    if args.sandbox == "docker":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from docker_engine import docker_client

        docker_client()  # the engine and every shipped task's image
    config = SWEGymConfig(sandbox=args.sandbox)
    rows = sorted(task_rows(), key=lambda row: row["instance_id"])
    grade_patch(rows[0], rows[0]["patch"], config)  # warm-up: repositories, task Python, images
    print(f"| task ({args.sandbox}) | seconds | resolved |\n|---|---:|---|")
    times, resolved = [], 0
    for row in rows:
        started = time.perf_counter()
        grade = grade_patch(row, row["patch"], config)
        times.append(time.perf_counter() - started)
        resolved += grade.resolved
        print(f"| {row['instance_id']} | {times[-1]:.2f} | {grade.resolved} |", flush=True)
    print(f"| **median of {len(rows)}** | **{statistics.median(times):.2f}** | **{resolved}/{len(rows)}** |")


if __name__ == "__main__":
    main()
