"""Grading time of the gold patch on each shipped SWE-Gym task, and whether it resolves (a false positive of the
integrity checks would show as not resolved).

    nice -n 10 python benchmarks/swegym_grading_time.py --sandbox local --repeats 1

Prints one row per task (seconds per grading, resolved, grading problem) and the median over the tasks."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from trl_multiturn.envs.swegym import SWEGymConfig, grade_patch, task_rows
from trl_multiturn.envs.swegym.tasks import shipped_repo


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sandbox", default="local", choices=["local", "docker"])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        rows = task_rows()
        for row in rows:
            shipped_repo(row["repo"], row["base_commit"], cache)
        config = SWEGymConfig(sandbox=args.sandbox, repo_cache_dir=cache, command_timeout=60)
        medians, resolved = [], 0
        print(f"| task | seconds ({args.sandbox}, median of {args.repeats}) | resolved | problem |\n|---|---|---|---|")
        for row in rows:
            times, grade = [], None
            for _ in range(args.repeats):
                start = time.perf_counter()
                grade = grade_patch(row, row["patch"], config, eval_timeout=120)
                times.append(time.perf_counter() - start)
            medians.append(statistics.median(times))
            resolved += grade.resolved
            print(f"| {row['instance_id']} | {medians[-1]:.2f} | {grade.resolved} | {grade.problem or '-'} |",
                  flush=True)
        print(f"\nmedian over {len(rows)} tasks: {statistics.median(medians):.2f} s; "
              f"gold resolved on {resolved} of {len(rows)}")


if __name__ == "__main__":
    main()
