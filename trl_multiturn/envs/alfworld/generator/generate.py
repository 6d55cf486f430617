"""Generate ALFWorld games offline, compiled and checked the way `alfworld-generate` compiles the dataset.

For each game: sample a task and room (`sampling`), write `initial_state.pddl` and `traj_data.json` (`problem`),
compile `game.tw-pddl` from ALFWorld's shipped `alfred.pddl` domain and `alfred.twl2` grammar with the goal put in
by ALFWorld's `add_task_to_grammar`, then let ALFWorld's hand-coded expert play it. Only a game the expert wins is
written, with `"solvable": true` and the expert's actions as its `walkthrough`, in the dataset layout, so
`list_tasks` and `ALFWorldEnv` read it exactly as they read downloaded games.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from ....config_checks import Range, check_fields, config_field
from ..engine import ExpertFailed, logic_files, play_expert, seeded_random
from ..layout import DATASET_DIR, GAME_FILE, SPLITS, TASK_TYPES, TRAJ_FILE
from . import problem
from .sampling import Knobs, sample_room


@dataclass
class ALFWorldGenConfig:
    """Complexity of generated games (as TextWorld's generator has world size and quest length)."""

    num_receptacles: int = config_field(
        8, "Receptacles in the room (the agent's search space), taken from the floor plan's own; at least the "
           "task's goal receptacle, appliance and starting receptacles, at most what the floor plan has.",
        range=Range(ge=0))
    num_distractors: int = config_field(
        6, "Objects besides the task's own, placed where ALFWorld's rules allow.", range=Range(ge=0))
    num_closed: int = config_field(
        2, "Openable receptacles (fridge, cabinet, drawer, microwave, safe), all closed at the start; a task's own "
           "appliance counts and is always there.", range=Range(ge=0))
    max_attempts: int = config_field(
        20, "Rooms sampled per game before giving up when the expert cannot solve them.", range=Range(ge=1))

    def __post_init__(self):
        check_fields(self)


class GenerationError(RuntimeError):
    """No solvable game came out of `max_attempts` sampled rooms."""


@dataclass
class GeneratedGame:
    """One solvable game: where it goes in the dataset layout and the three files its trial folder holds."""

    split: str
    trial: str  # "<task folder>/<trial id>", relative to json_2.1.1/<split>/
    traj_data: dict
    game: dict

    @property
    def initial_state(self) -> str:
        """The PDDL problem (`initial_state.pddl`), as the game file holds it."""
        return self.game["pddl_problem"]

    def write(self, root: str | os.PathLike) -> Path:
        """Write the trial under `root/json_2.1.1/<split>/` and return its `game.tw-pddl` path."""
        folder = Path(root) / DATASET_DIR / self.split / self.trial
        _write_trial(folder, self)
        return folder / GAME_FILE


def _write_trial(folder: Path, game: GeneratedGame) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "initial_state.pddl").write_text(game.initial_state)
    (folder / TRAJ_FILE).write_text(json.dumps(game.traj_data, indent=2))
    (folder / GAME_FILE).write_text(json.dumps(game.game))


def _knobs(config: ALFWorldGenConfig) -> Knobs:
    return Knobs(config.num_receptacles, config.num_distractors, config.num_closed)


def _check(task_type: str, split: str) -> None:
    if task_type not in TASK_TYPES:
        raise ValueError(f"task_type={task_type!r}: use one of {TASK_TYPES}.")
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: use one of {SPLITS}.")


def generate_game(
    task_type: str, seed: int, config: ALFWorldGenConfig | None = None, split: str = "train"
) -> GeneratedGame:
    """The game of `task_type` that `seed` names: the same arguments always give the same files.

    `split` only places the game, except "valid_unseen", whose rooms come from ALFRED's held-out test floor plans.
    Raises `GenerationError` if ALFWorld's expert solves none of `config.max_attempts` sampled rooms.
    """
    from alfworld.agents.utils.misc import add_task_to_grammar, get_templated_task_desc

    _check(task_type, split)
    config = config or ALFWorldGenConfig()
    knobs = _knobs(config)
    domain, grammar = logic_files()
    settings = {k: v for k, v in asdict(config).items() if k != "max_attempts"}
    problem_id = problem.trial_id(seed, knobs)
    failures = []
    for attempt in range(config.max_attempts):
        key = f"alfworld-gen:{task_type}:{seed}:{attempt}"
        room = sample_room(task_type, knobs, random.Random(key), unseen=split == "valid_unseen")
        traj = problem.traj_data(room, problem_id, seed, settings)
        with seeded_random(key):  # ALFWorld picks the goal template with the global `random`
            goal_text = get_templated_task_desc(traj)
        traj["turk_annotations"] = {"anns": [{"task_desc": goal_text, "high_descs": [], "votes": []}]}
        # Goal from the annotation, through ALFWorld's own path (`alfworld-generate --goal_desc_human_anns_prob 1`).
        game = {
            "pddl_domain": domain,
            "grammar": add_task_to_grammar(grammar, traj, goal_desc_human_anns_prob=1.0, rng=random.Random(key)),
            "pddl_problem": problem.initial_state(room, problem_id),
            "solvable": None,
            "walkthrough": None,
        }
        candidate = GeneratedGame(split, f"{problem.task_folder(room)}/{problem_id}", traj, game)
        with tempfile.TemporaryDirectory(prefix="alfworld-gen-") as tmp:
            _write_trial(Path(tmp), candidate)
            try:
                walkthrough = play_expert(Path(tmp) / GAME_FILE, "handcoded", seed=key)
            except ExpertFailed as err:
                failures.append(str(err))
                continue
        game["solvable"], game["walkthrough"] = True, walkthrough
        return candidate
    raise GenerationError(
        f"No solvable {task_type} game for seed {seed} in {config.max_attempts} attempts; last: {failures[-1]}. "
        "Raise max_attempts or num_receptacles."
    )


def existing_game(root: str | os.PathLike, task_type: str, seed: int, config: ALFWorldGenConfig, split: str):
    """The `game.tw-pddl` that `generate_games` wrote earlier for these arguments, or None."""
    trial = problem.trial_id(seed, _knobs(config))
    found = sorted((Path(root) / DATASET_DIR / split).glob(f"{task_type}-*/{trial}/{GAME_FILE}"))
    return found[0] if found else None


def generate_games(
    output_dir: str | os.PathLike,
    seeds: Iterable[int],
    task_types: Iterable[str] | None = None,
    split: str = "train",
    config: ALFWorldGenConfig | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> list[Path]:
    """Write one solvable game per seed and task type under `output_dir/json_2.1.1/<split>/`.

    Games already there (same task type, seed and knobs) are reused unless `overwrite`. Returns the
    `game.tw-pddl` paths; `list_tasks(output_dir, split)` turns the folder into task rows. `progress` shows a
    progress bar.
    """
    from ....progress import progress_bar

    config = config or ALFWorldGenConfig()
    types = tuple(task_types) if task_types is not None else TASK_TYPES
    seeds = list(seeds)
    paths = []
    with progress_bar(total=len(types) * len(seeds), desc=f"ALFWorld {split} games", unit="game",
                      enabled=progress) as bar:
        for task_type in types:
            _check(task_type, split)
            for seed in seeds:
                found = None if overwrite else existing_game(output_dir, task_type, seed, config, split)
                paths.append(found or generate_game(task_type, seed, config, split).write(output_dir))
                bar.update()
    return paths
