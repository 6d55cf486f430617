"""Choosing SWE-Gym tasks for a study: difficulty tiers (by gold-patch size and test count) and a train/held-out
split that depends on each task's id alone.

    rows = task_rows()
    tiers = difficulty_tiers(rows)            # {"trl-multiturn__lrucache-1": "easy", ...}
    held_out = held_out_ids(rows, 0.5)        # evaluated only, never trained on
    train = select_tasks(rows, held_out=False, fraction=0.5, tiers=["easy"])
"""

from __future__ import annotations

import hashlib
import json

TIERS = ("easy", "medium", "hard")


def patch_size(patch: str) -> int:
    """Lines a unified diff adds or removes (lines starting with '+' or '-', the '+++'/'---' file headers
    excluded)."""
    return sum(line[:1] in "+-" and not line.startswith(("+++", "---")) for line in patch.splitlines())


def fail_to_pass_count(row: dict) -> int:
    """The tests the fix must turn from failing to passing (`FAIL_TO_PASS`; SWE-bench rows may hold the list as
    JSON text)."""
    tests = row.get("FAIL_TO_PASS") or []
    return len(json.loads(tests) if isinstance(tests, str) else tests)


def difficulty_tiers(rows: list[dict], tiers: tuple[str, ...] = TIERS) -> dict[str, str]:
    """instance_id -> tier. The tasks are ranked by (gold patch size, test count, instance_id), and rank i of n goes
    to tiers[i * len(tiers) // n]: equal parts, the smallest fixes first. Tiers are relative to `rows` (rank them
    all, before any split, so that a task's tier does not depend on which side of the split it falls)."""
    ranked = sorted(rows, key=lambda row: (patch_size(row.get("patch") or ""), fail_to_pass_count(row),
                                           row["instance_id"]))
    return {row["instance_id"]: tiers[i * len(tiers) // len(ranked)] for i, row in enumerate(ranked)}


def held_out_score(instance_id: str) -> float:
    """A task's place in [0, 1): the first 32 bits of sha256(instance_id) / 2**32."""
    return int(hashlib.sha256(instance_id.encode()).hexdigest()[:8], 16) / 2**32


def held_out_ids(rows: list[dict], fraction: float) -> set[str]:
    """The held-out tasks: those with held_out_score(instance_id) < fraction. A task's side depends on its id
    alone, so it stays on that side when the task set grows or a study trains on some tiers only."""
    if not 0 < fraction < 1:
        raise ValueError(f"held_out_fraction={fraction}: use a number between 0 and 1 (exclusive)")
    return {row["instance_id"] for row in rows if held_out_score(row["instance_id"]) < fraction}


def select_tasks(rows: list[dict], held_out: bool, fraction: float, tiers: list[str] | None = None,
                 count: int | None = None) -> list[dict]:
    """The rows on one side of the split (`held_out`), in the given tiers (None: all), the first `count` of them
    (None: all), in `rows`' order."""
    unknown = sorted(set(tiers or ()) - set(TIERS))
    if unknown:
        raise ValueError(f"SWE-Gym tiers {unknown}: choose from {list(TIERS)}")
    tier_of = difficulty_tiers(rows)
    side = held_out_ids(rows, fraction)
    chosen = [row for row in rows
              if (row["instance_id"] in side) == held_out and (tiers is None or tier_of[row["instance_id"]] in tiers)]
    return chosen if count is None else chosen[:count]
