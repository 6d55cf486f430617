"""Datasets for training and evaluation: one row per task, in the form the environment's `reset(task)` reads.

Task datasets
-------------
Generated games are drawn from disjoint seed ranges per split (`SEED_RANGES`), so no training seed is ever a
validation or test seed. `textworld_tasks` builds a TextWorld task set, `textworld_mixture` equal parts of several
TextWorld shapes in one set, and `alfworld_tasks` an ALFWorld set of some task types (equal parts of each).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from typing import Any

import datasets

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


def textworld_tasks(
    world_size: int | None = None,
    nb_objects: int | None = None,
    quest_length: int | None = None,
    *,
    challenge: str | None = None,
    split: str = "train",
    num_games: int = 100,
    first_game: int = 0,
    games_dir: str | os.PathLike | None = None,
    generate: bool = True,
    **challenge_settings: Any,
) -> datasets.Dataset:
    """A TextWorld task set: `num_games` games of one kind, seeded from `split`'s seed range.

    Either the paper's custom games, `textworld_tasks(2, 3, 4, split="test", num_games=50)` (w2-o3-q4), or a
    challenge, `textworld_tasks(challenge="tw-simple", rewards="dense", goal="detailed")`.

    Each row holds the generation parameters and `seed`, plus `game_file`: the compiled game in `games_dir`
    (`TextWorldEnv`'s default cache when None) when `generate` is True, else None (the environment then generates
    the game on first use). Resets from a row whose file exists cost no generation.
    """
    from .envs.textworld import default_games_dir
    from .envs.textworld_games import ChallengeGameSpec, CustomGameSpec, generate_game

    if challenge is not None:
        if any(value is not None for value in (world_size, nb_objects, quest_length)):
            raise ValueError("pass either `challenge` (and its settings) or world_size/nb_objects/quest_length")
        spec = ChallengeGameSpec.create(challenge, **challenge_settings)
    else:
        if challenge_settings:
            raise ValueError(f"settings {sorted(challenge_settings)} need a `challenge`, e.g. challenge='tw-simple'")
        spec = CustomGameSpec(world_size, nb_objects, quest_length)
    games_dir = games_dir if games_dir is not None else default_games_dir()
    rows = []
    for seed in split_seeds(split, num_games, first_game):
        game_file = str(generate_game(spec, seed, games_dir)) if generate else None
        rows.append({"game_file": game_file, **spec.task_row(seed)})
    return datasets.Dataset.from_list(rows)


_SHAPE = re.compile(r"^w(\d+)-o(\d+)-q(\d+)$")


def parse_shape(shape: str) -> tuple[int, int, int]:
    """The paper's name of a custom TextWorld shape, `"w2-o3-q4"`, as (world_size, nb_objects, quest_length)."""
    match = _SHAPE.match(shape.strip())
    if not match:
        raise ValueError(f"TextWorld shape {shape!r}: write w<rooms>-o<objects>-q<quest length>, e.g. 'w2-o3-q4'")
    world_size, nb_objects, quest_length = (int(x) for x in match.groups())
    return world_size, nb_objects, quest_length


def equal_parts(total: int, parts: int) -> list[int]:
    """`total` split into `parts` counts that differ by at most one, the larger ones first: (7, 3) -> [3, 2, 2]."""
    if parts < 1 or total < parts:
        raise ValueError(f"cannot split {total} games into {parts} equal parts: give at least one game per part")
    return [total // parts + (k < total % parts) for k in range(parts)]


def _interleave(parts: list[list[dict]]) -> list[dict]:
    """Round-robin over the parts, so that any run of consecutive rows holds every part."""
    rows = []
    for k in range(max(len(part) for part in parts)):
        rows += [part[k] for part in parts if k < len(part)]
    return rows


def textworld_mixture(
    shapes: Sequence[str],
    *,
    split: str = "train",
    num_games: int = 100,
    first_game: int = 0,
    games_dir: str | os.PathLike | None = None,
    generate: bool = True,
) -> datasets.Dataset:
    """Equal parts of several custom TextWorld shapes in one task set, e.g. the paper's mixed-complexity training
    set `textworld_mixture(["w2-o3-q4", "w4-o6-q8"], num_games=200)` (100 games of each, interleaved).

    Each shape plays games `first_game` .. of `split`'s seed range (`equal_parts(num_games, len(shapes))` of them);
    one shape gives exactly `textworld_tasks(*parse_shape(shape), ...)`. Rows carry `shape` besides the usual task
    columns, so results can be broken down per shape.
    """
    if not shapes:
        raise ValueError("shapes: name at least one TextWorld shape, e.g. ['w2-o3-q4']")
    if len(set(shapes)) != len(shapes):
        raise ValueError(f"shapes {list(shapes)} repeats a shape; each shape is one equal part")
    parts = []
    for shape, count in zip(shapes, equal_parts(num_games, len(shapes))):
        tasks = textworld_tasks(*parse_shape(shape), split=split, num_games=count, first_game=first_game,
                                games_dir=games_dir, generate=generate)
        parts.append([{**row, "shape": shape} for row in tasks])
    return datasets.Dataset.from_list(_interleave(parts))


def alfworld_tasks(
    split: str = "train",
    num_games: int | None = None,
    task_types: Sequence[str] | None = None,
    *,
    data_path: str | os.PathLike | None = None,
    games_dir: str | os.PathLike = "outputs/alfworld_games",
    gen_config=None,
    seed: int = 0,
    generated_games: int = 12,
) -> datasets.Dataset:
    """ALFWorld task rows of `split` ("train", "valid_seen", "valid_unseen") for some task types (default: all six),
    `num_games` of them (None: all) in equal parts per type (`equal_parts`), interleaved.

    Games come from `data_path`, else from `$ALFWORLD_DATA` when `alfworld-download` has filled it, else they are
    generated into `games_dir` (`ceil(num_games / types)` per type, `generated_games` in all when `num_games` is None;
    `gen_config` is an `ALFWorldGenConfig`; training games from the train split's seeds, held-out ones from the
    test split's, so the two never share a seed). The paper's task-type mixtures train on one, four or six types
    and evaluate on all six: `alfworld_tasks("train", 600, ["pick_and_place_simple"])` against
    `alfworld_tasks("valid_unseen")`. `seed` picks which games of a type are kept when there are more.
    """
    import random

    from .envs.alfworld import TASK_TYPES, list_tasks
    from .envs.alfworld.tasks import dataset_root

    types = list(task_types or TASK_TYPES)
    root = dataset_root(data_path)
    if data_path is not None or (root / split).is_dir():
        tasks = list_tasks(root, split, types)
    else:
        from .envs.alfworld_gen import generate_games

        per_type = math.ceil((num_games or generated_games) / len(types))
        seed_split = "train" if split == "train" else "test"  # seed ranges never overlap across splits
        wanted = {str(p) for p in generate_games(games_dir, split_seeds(seed_split, per_type), types, split,
                                                 gen_config)}
        tasks = list_tasks(games_dir, split, types).filter(lambda row: row["game_file"] in wanted)
    if num_games is None:
        return tasks
    rng = random.Random(seed)
    parts = []
    for task_type, count in zip(types, equal_parts(num_games, len(types))):
        rows = [row for row in tasks if row["task_type"] == task_type]
        if len(rows) < count:
            raise ValueError(f"num_games={num_games}: {count} {task_type} games wanted, {len(rows)} in {split}")
        parts.append(rng.sample(rows, count))
    return datasets.Dataset.from_list(_interleave(parts))
