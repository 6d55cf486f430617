"""ALFWorld's dataset layout: task rows that name a game, and listing the games of a data folder.

The layout is `json_2.1.1/{train,valid_seen,valid_unseen}/<task type>-<object>-<mrecep>-<parent>-<scene>/<trial>/`
holding `traj_data.json`, `initial_state.pddl` and the compiled `game.tw-pddl`, whether the games come from
`alfworld-download` or from `trl-multiturn make-games --env alfworld`. `alfworld_tasks` builds a task set of
some task types (equal parts of each), from downloaded games or generated ones.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ...data import equal_parts, interleave, split_seeds
from ..base import TaskError
from .generator import generate_games
from .layout import DATASET_DIR, GAME_FILE, SPLITS, TASK_TYPES, TRAJ_FILE

if TYPE_CHECKING:
    from datasets import Dataset


_GOAL = re.compile(r"Your task is to: (.*?)\.?\"")
_FIX = (
    "Use `trl_multiturn.envs.alfworld.list_tasks(data_path)` (games from `alfworld-download` or "
    "`trl-multiturn make-games --env alfworld`) to build rows."
)


def default_data_path() -> Path:
    """`$ALFWORLD_DATA` (ALFWorld's own default: ~/.cache/alfworld), where `alfworld-download` puts the games."""
    return Path(os.environ.get("ALFWORLD_DATA", "~/.cache/alfworld")).expanduser()


def dataset_root(data_path: str | os.PathLike | None = None) -> Path:
    """The `json_2.1.1` folder inside `data_path` (or `data_path` itself when it is that folder)."""
    path = Path(data_path).expanduser() if data_path is not None else default_data_path()
    return path / DATASET_DIR if (path / DATASET_DIR).is_dir() else path


def resolve_game_file(task, data_path: str | os.PathLike | None = None) -> Path:
    """The `game.tw-pddl` a task row names, checked; relative paths resolve against `data_path`.

    Raises `TaskError` naming the field and the fix when the row cannot be played.
    """
    if not isinstance(task, Mapping):
        raise TaskError(f"An ALFWorld task must be a dict (one dataset row), got {type(task).__name__}. {_FIX}")
    if "game_file" not in task:
        raise TaskError(
            f"The task row has no 'game_file' field (fields: {sorted(task)}); give the path of a {GAME_FILE}. {_FIX}"
        )
    value = task["game_file"]
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise TaskError(f"'game_file' must be a path to a {GAME_FILE}, got {value!r}. {_FIX}")
    path = Path(value).expanduser()
    if not path.is_absolute() and data_path is not None:
        path = dataset_root(data_path) / path
    if path.is_dir():
        path = path / GAME_FILE
    if path.suffix != ".tw-pddl":
        raise TaskError(f"'game_file'={str(value)!r} is not a {GAME_FILE} file (ALFWorld's compiled game). {_FIX}")
    if not path.is_file():
        relative = not Path(value).is_absolute() and data_path is None
        hint = " (relative: set ALFWorldConfig.data_path)" if relative else ""
        raise TaskError(f"'game_file'={str(value)!r}: no such file {path}{hint}. {_FIX}")
    return path


def read_game(path: Path) -> dict:
    """The JSON of a `game.tw-pddl`, with a `TaskError` when it is not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise TaskError(f"'game_file'={str(path)!r} is not a readable {GAME_FILE} JSON file ({err}). {_FIX}") from err
    missing = [key for key in ("pddl_domain", "grammar", "pddl_problem") if key not in data]
    if missing:
        raise TaskError(f"'game_file'={str(path)!r} lacks {missing}; recompile it with `alfworld-generate`. {_FIX}")
    return data


def goal_of(game: dict) -> str:
    """The goal sentence ("heat some potato and put it in sinkbasin") compiled into a game's grammar."""
    match = _GOAL.search(game["grammar"])
    return match.group(1) if match else ""


def list_tasks(
    data_path: str | os.PathLike | None = None,
    split: str = "train",
    task_types: Iterable[str] | None = None,
):
    """Task rows (a `datasets.Dataset`) for the solvable games of one split, as ALFWorld's `AlfredTWEnv` selects them.

    Args:
        data_path: `$ALFWORLD_DATA`-style folder (holding `json_2.1.1/`) or the `json_2.1.1` folder itself;
            defaults to `$ALFWORLD_DATA`.
        split: "train", "valid_seen" (in distribution) or "valid_unseen" (out of distribution).
        task_types: keep only these of the six task types (default: all).

    Each row is `{"game_file", "task_type", "split", "goal"}`; games marked unsolvable, sliced or movable-receptacle
    tasks are skipped, as ALFWorld does. Sorted by path, so the order is the same on every machine.
    """
    from datasets import Dataset

    if split not in SPLITS:
        raise ValueError(f"split={split!r}: use one of {SPLITS}.")
    wanted = tuple(task_types) if task_types is not None else TASK_TYPES
    unknown = sorted(set(wanted) - set(TASK_TYPES))
    if unknown:
        raise ValueError(f"task_types: unknown {unknown}; ALFWorld's six are {TASK_TYPES}.")
    root = dataset_root(data_path)
    split_dir = root / split
    if not split_dir.is_dir():
        present = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        raise ValueError(
            f"data_path: no '{split}' split under {root} (found {present or 'nothing'}). Download the games with "
            "`alfworld-download` (sets $ALFWORLD_DATA) or generate some with "
            "`trl-multiturn make-games --env alfworld`."
        )
    rows = []
    for traj_path in sorted(split_dir.glob(f"*/*/{TRAJ_FILE}")):
        trial = traj_path.parent
        game_path = trial / GAME_FILE
        if "movable" in str(trial) or "Sliced" in str(trial) or not game_path.is_file():
            continue
        task_type = json.loads(traj_path.read_text()).get("task_type")
        if task_type not in wanted:
            continue
        game = json.loads(game_path.read_text())
        if not game.get("solvable"):
            continue
        rows.append({"game_file": str(game_path), "task_type": task_type, "split": split, "goal": goal_of(game)})
    if not rows:
        raise ValueError(f"data_path: no solvable games of types {list(wanted)} under {split_dir}.")
    return Dataset.from_list(rows)


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
    first_game: int = 0,
    progress: bool = True,
) -> Dataset:
    """ALFWorld task rows of `split` ("train", "valid_seen", "valid_unseen") for some task types (default: all six),
    `num_games` of them (None: all) in equal parts per type (`equal_parts`), interleaved.

    Games come from `data_path`, else from `$ALFWORLD_DATA` when `alfworld-download` has filled it, else they are
    generated into `games_dir` (`ceil(num_games / types)` per type, `generated_games` in all when `num_games` is None;
    `gen_config` is an `ALFWorldGenConfig`; training games from the train split's seeds, held-out ones from the
    test split's, so the two never share a seed; `first_game` is the index in the split's seed range of the first one,
    so that two sets of one split, such as SFT games from 500000 and RL games from 0, never share a game; `progress`
    shows generation's progress bar). The paper's task-type mixtures train on one, four or six types
    and evaluate on all six: `alfworld_tasks("train", 600, ["pick_and_place_simple"])` against
    `alfworld_tasks("valid_unseen")`. `seed` picks which games of a type are kept when there are more.
    """
    import random

    from datasets import Dataset

    types = list(task_types or TASK_TYPES)
    root = dataset_root(data_path)
    if data_path is not None or (root / split).is_dir():
        tasks = list_tasks(root, split, types)
    else:
        per_type = math.ceil((num_games or generated_games) / len(types))
        seed_split = "train" if split == "train" else "test"  # seed ranges never overlap across splits
        wanted = {str(p) for p in generate_games(games_dir, split_seeds(seed_split, per_type, first_game), types,
                                                 split, gen_config, progress=progress)}
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
    return Dataset.from_list(interleave(parts))
