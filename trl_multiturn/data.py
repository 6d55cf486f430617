"""Datasets for training and evaluation: one row per task, in the form the environment's `reset(task)` reads.

Task datasets
-------------
Generated games are drawn from disjoint seed ranges per split (`SEED_RANGES`), so no training seed is ever a
validation or test seed. `textworld_tasks` builds a TextWorld task set.
"""

from __future__ import annotations

import os
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
    from .envs.textworld import default_games_dir
    from .envs.textworld_games import ChallengeGameSpec, CustomGameSpec, generate_game
    from .progress import progress_bar

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
