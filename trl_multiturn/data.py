"""Task datasets shared by every environment: disjoint seed ranges per split, and equal-part mixtures.

Generated games are drawn from disjoint seed ranges per split (`SEED_RANGES`), so no training seed is ever a
validation or test seed. Each environment's own task sets live in its package: `trl_multiturn.envs.textworld.tasks`
(`textworld_tasks`, `textworld_mixture`) and `trl_multiturn.envs.alfworld.tasks` (`alfworld_tasks`).
`trl_multiturn.data.textworld_tasks`, the README's import, still works (a lazy re-export: importing this module
does not import TextWorld).
"""

from __future__ import annotations

from .lazy import lazy_getattr

SEED_RANGES: dict[str, range] = {
    "train": range(0, 1_000_000),
    "validation": range(1_000_000, 1_100_000),
    "test": range(1_100_000, 1_200_000),
}
"""Seeds of procedurally generated tasks, per split. The ranges never overlap."""


def split_seeds(split: str, num_games: int, first_game: int = 0) -> list[int]:
    """The seeds of games `first_game` .. `first_game + num_games - 1` of `split` (a key of `SEED_RANGES`)."""
    if split not in SEED_RANGES:
        raise ValueError(f"`split` must be one of {', '.join(SEED_RANGES)}, got {split!r}")
    seeds = SEED_RANGES[split]
    if num_games < 1 or first_game < 0 or first_game + num_games > len(seeds):
        raise ValueError(
            f"`num_games` ({num_games}) from `first_game` ({first_game}) must fit in the {len(seeds)} seeds of the "
            f"{split!r} split: use 1 <= num_games and first_game + num_games <= {len(seeds)}"
        )
    return list(seeds[first_game:first_game + num_games])


def equal_parts(total: int, parts: int) -> list[int]:
    """`total` split into `parts` counts that differ by at most one, the larger ones first: (7, 3) -> [3, 2, 2]."""
    if parts < 1 or total < parts:
        raise ValueError(f"cannot split {total} games into {parts} equal parts: give at least one game per part")
    return [total // parts + (k < total % parts) for k in range(parts)]


def interleave(parts: list[list[dict]]) -> list[dict]:
    """Round-robin over the parts, so that any run of consecutive rows holds every part."""
    rows = []
    for k in range(max(len(part) for part in parts)):
        rows += [part[k] for part in parts if k < len(part)]
    return rows


_REEXPORTS = {"textworld_tasks": "trl_multiturn.envs.textworld.tasks"}

__getattr__ = lazy_getattr(__name__, _REEXPORTS)
