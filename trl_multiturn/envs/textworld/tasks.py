"""TextWorld task sets: games of one shape or challenge (`textworld_tasks`), or equal parts of several shapes
(`textworld_mixture`), seeded from the split's range of `trl_multiturn.data.SEED_RANGES`."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import datasets

from ...data import equal_parts, interleave, split_seeds
from ...progress import progress_bar
from .env import default_games_dir
from .games import ChallengeGameSpec, CustomGameSpec, generate_game


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
    progress: bool = True,
    **challenge_settings: Any,
) -> datasets.Dataset:
    """A TextWorld task set: `num_games` games of one kind, seeded from `split`'s seed range.

    Either the paper's custom games, `textworld_tasks(2, 3, 4, split="test", num_games=50)` (w2-o3-q4), or a
    challenge, `textworld_tasks(challenge="tw-simple", rewards="dense", goal="detailed")`.

    Each row holds the generation parameters and `seed`, plus `game_file`: the compiled game in `games_dir`
    (`TextWorldEnv`'s default cache when None) when `generate` is True, else None (the environment then generates
    the game on first use). Resets from a row whose file exists cost no generation. `progress` shows a progress bar
    while games are generated.
    """

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
    seeds = split_seeds(split, num_games, first_game)
    with progress_bar(total=len(seeds), desc=f"TextWorld {split} games", unit="game",
                      enabled=progress and generate) as bar:
        for seed in seeds:
            game_file = str(generate_game(spec, seed, games_dir)) if generate else None
            rows.append({"game_file": game_file, **spec.task_row(seed)})
            bar.update()
    return datasets.Dataset.from_list(rows)


_SHAPE = re.compile(r"^w(\d+)-o(\d+)-q(\d+)$")


def parse_shape(shape: str) -> tuple[int, int, int]:
    """The paper's name of a custom TextWorld shape, `"w2-o3-q4"`, as (world_size, nb_objects, quest_length)."""
    match = _SHAPE.match(shape.strip())
    if not match:
        raise ValueError(f"TextWorld shape {shape!r}: write w<rooms>-o<objects>-q<quest length>, e.g. 'w2-o3-q4'")
    world_size, nb_objects, quest_length = (int(x) for x in match.groups())
    return world_size, nb_objects, quest_length




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
    return datasets.Dataset.from_list(interleave(parts))
