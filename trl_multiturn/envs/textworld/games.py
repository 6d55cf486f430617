"""TextWorld game generation, in-process, deterministic by seed, cached on disk.

Two kinds of games:

* `CustomGameSpec`: the paper's `custom` games (`w2-o3-q4` = 2 rooms, 3 objects, a 4-step quest). A game made here
  is the game `tw-make custom --world-size W --nb-objects O --quest-length Q --seed S` makes.
* `ChallengeGameSpec`: a challenge registered in `textworld.challenges` (`tw-simple` with `rewards` dense / balanced /
  sparse and `goal` detailed / brief / none; also `tw-cooking`, `tw-coin_collector`, `tw-treasure_hunter`), its
  settings checked by the challenge's own argument parser.

A game is a `.z8` story file plus the `.json` TextWorld needs next to it. Its file name is a pure function of the
spec and the seed, so a folder of games doubles as a cache: `generate_game` returns an existing file untouched.
Two processes generating the same game at once are safe: each compiles in a private temporary folder, then renames
the `.json` and finally the `.z8` into place (the `.z8` appears last, so a visible `.z8` always has its `.json`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import textworld
import textworld.challenges
from textworld.generator import QuestGenerationError, compile_game, make_game
from textworld.generator.game import Game, GameProgression
from textworld.generator.inform7 import Inform7Game

logger = logging.getLogger(__name__)

GAME_EXT = ".z8"
MAX_SEED = 2**32 - 1  # numpy's RandomState, which TextWorld seeds with it, accepts [0, 2**32).
CUSTOM_FIELDS = ("world_size", "nb_objects", "quest_length")

# tw-make's defaults for `custom` games, so that a spec here and the same `tw-make custom` command agree.
_TW_MAKE_MAX_BREADTH = 5


class GameGenerationError(RuntimeError):
    """TextWorld could not build a game from these parameters (e.g. no quest of that length fits the world)."""


def _check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (maximum and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum else f">= {minimum}"
        raise ValueError(f"`{name}` must be an integer {bound}, got {value!r}")
    return value


def check_seed(seed: Any) -> int:
    """Return `seed` if TextWorld can use it as a game seed, else raise a ValueError that says what to pass."""
    return _check_int("seed", seed, 0, MAX_SEED)


@dataclass(frozen=True)
class CustomGameSpec:
    """The paper's `custom` games: `world_size` rooms, at least `nb_objects` objects, a `quest_length`-step quest."""

    world_size: int
    nb_objects: int
    quest_length: int

    def __post_init__(self):
        _check_int("world_size", self.world_size, 1)
        _check_int("nb_objects", self.nb_objects, 0)
        _check_int("quest_length", self.quest_length, 1)

    @property
    def label(self) -> str:
        """The paper's short name, e.g. `w2-o3-q4`."""
        return f"w{self.world_size}-o{self.nb_objects}-q{self.quest_length}"

    def name(self, seed: int) -> str:
        return f"tw-custom-{self.label}-seed{seed}"

    def task_row(self, seed: int) -> dict[str, Any]:
        return {"world_size": self.world_size, "nb_objects": self.nb_objects, "quest_length": self.quest_length,
                "seed": seed}

    def build(self, seed: int) -> Game:
        options = textworld.GameOptions()
        options.seeds = seed
        options.nb_rooms = self.world_size
        options.nb_objects = self.nb_objects
        options.quest_length = self.quest_length  # sets min/max length and max depth, as `--quest-length` does
        options.chaining.max_breadth = _TW_MAKE_MAX_BREADTH
        try:
            return make_game(options)
        except QuestGenerationError as exc:
            raise GameGenerationError(
                f"TextWorld found no {self.quest_length}-step quest in a world of {self.world_size} rooms and "
                f"{self.nb_objects} objects for seed {seed}: use a shorter quest_length, a larger world_size or "
                "another seed"
            ) from exc


class _ParserError(ValueError):
    pass


class _RaisingParser(argparse.ArgumentParser):
    """A challenge's own argument parser, made to raise instead of exiting the process."""

    def error(self, message):
        raise _ParserError(message)


def _challenge_parser(challenge: str) -> argparse.ArgumentParser:
    if challenge not in textworld.challenges.CHALLENGES:
        known = ", ".join(sorted(textworld.challenges.CHALLENGES))
        raise ValueError(f"`challenge` {challenge!r} is not a TextWorld challenge; pass one of: {known}")
    _, _, add_arguments = textworld.challenges.CHALLENGES[challenge]
    parser = _RaisingParser(prog=challenge, add_help=False)
    add_arguments(parser)
    return parser


def challenge_setting_names(challenge: str) -> list[str]:
    """The setting names a challenge takes (its parser's destinations), e.g. `rewards`, `goal`, `test`."""
    # argparse has no public accessor for the declared options; `_actions` has been stable since Python 2.7.
    return [action.dest for action in _challenge_parser(challenge)._actions]


@dataclass(frozen=True)
class ChallengeGameSpec:
    """A game of a registered TextWorld challenge; build it with `ChallengeGameSpec.create` to check the settings."""

    challenge: str
    settings: tuple[tuple[str, Any], ...]  # every setting, defaults filled in, sorted by name

    @classmethod
    def create(cls, challenge: str, **settings: Any) -> "ChallengeGameSpec":
        """Check `settings` with the challenge's own parser (choices, required ones, types) and fill defaults."""
        parser = _challenge_parser(challenge)
        argv = []
        for key, value in settings.items():
            option = "--" + key.replace("_", "-")
            if isinstance(value, bool):
                argv += [option] if value else []
            else:
                argv += [option, str(value)]
        try:
            parsed = parser.parse_args(argv)
        except _ParserError as exc:
            names = ", ".join(challenge_setting_names(challenge))
            raise ValueError(f"bad settings for challenge {challenge!r}: {exc} (its settings: {names})") from None
        return cls(challenge, tuple(sorted(vars(parsed).items())))

    def name(self, seed: int) -> str:
        parts = [f"{key}_{re.sub(r'[^A-Za-z0-9.]', '', str(value))}" for key, value in self.settings]
        return "-".join([self.challenge, *parts, f"seed{seed}"])

    def task_row(self, seed: int) -> dict[str, Any]:
        return {"challenge": self.challenge, **dict(self.settings), "seed": seed}

    def build(self, seed: int) -> Game:
        _, make, _ = textworld.challenges.CHALLENGES[self.challenge]
        options = textworld.GameOptions()
        options.seeds = seed
        try:
            return make(settings=dict(self.settings), options=options)
        except QuestGenerationError as exc:
            raise GameGenerationError(f"{self.challenge} could not make a game for seed {seed}: {exc}") from exc


GameSpec = CustomGameSpec | ChallengeGameSpec


def game_path(spec: GameSpec, seed: int, out_dir: str | os.PathLike) -> Path:
    """Where the game for (`spec`, `seed`) lives in `out_dir`, generated or not."""
    return Path(out_dir) / (spec.name(check_seed(seed)) + GAME_EXT)


def is_complete(game_file: str | os.PathLike) -> bool:
    """A playable game: the `.z8` story and the `.json` TextWorld reads next to it."""
    game_file = Path(game_file)
    return game_file.is_file() and game_file.with_suffix(".json").is_file()


def generate_game(spec: GameSpec, seed: int, out_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """Return the game file for (`spec`, `seed`) in `out_dir`, generating and compiling it if it is not there."""
    game_file = game_path(spec, seed, out_dir)
    if is_complete(game_file) and not overwrite:
        return game_file
    game_file.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    game = spec.build(seed)
    with tempfile.TemporaryDirectory(dir=game_file.parent, prefix=".tmp-") as tmp:
        options = textworld.GameOptions()
        options.path = str(Path(tmp) / game_file.name)
        options.force_recompile = True
        compiled = Path(compile_game(game, options))
        os.replace(compiled.with_suffix(".json"), game_file.with_suffix(".json"))
        os.replace(compiled, game_file)
    logger.info("generated %s in %.2f s", game_file, time.perf_counter() - start)
    return game_file


def make_games(world_size: int, nb_objects: int, quest_length: int, seeds: Iterable[int],
               out_dir: str | os.PathLike, overwrite: bool = False) -> list[Path]:
    """Generate the paper's `custom` games (`w{world_size}-o{nb_objects}-q{quest_length}`), one per seed.

    Games already in `out_dir` are reused; the same seed always gives the same game.
    """
    spec = CustomGameSpec(world_size, nb_objects, quest_length)
    return [generate_game(spec, seed, out_dir, overwrite) for seed in seeds]


def make_challenge_games(challenge: str, seeds: Iterable[int], out_dir: str | os.PathLike,
                         overwrite: bool = False, **settings: Any) -> list[Path]:
    """Generate games of a TextWorld challenge, one per seed, e.g.

    `make_challenge_games("tw-simple", rewards="dense", goal="detailed", seeds=range(10), out_dir="games")`.
    """
    spec = ChallengeGameSpec.create(challenge, **settings)
    return [generate_game(spec, seed, out_dir, overwrite) for seed in seeds]


def game_fingerprint(game_file: str | os.PathLike) -> str:
    """A hash of the game's content (its `.json`), equal for two files holding the same game.

    TextWorld serialises one set (the grammar's `names_to_exclude`) in hash order, which varies between processes;
    it is sorted before hashing.
    """
    data = json.loads(Path(game_file).with_suffix(".json").read_text())
    grammar = data.get("grammar") or {}
    if "names_to_exclude" in grammar:
        grammar["names_to_exclude"] = sorted(grammar["names_to_exclude"], key=json.dumps)  # holds None too
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def walkthrough(game_file: str | os.PathLike) -> list[str]:
    """The game's expert solution: its recorded walkthrough, else the winning policy TextWorld derives."""
    game = Game.load(str(Path(game_file).with_suffix(".json")))
    if game.metadata.get("walkthrough"):
        return list(game.metadata["walkthrough"])
    policy = GameProgression(game, track_quests=True).winning_policy or []
    return Inform7Game(game).gen_commands_from_actions(policy)


def spec_from_task(task: Mapping[str, Any]) -> tuple[GameSpec, int] | None:
    """The (spec, seed) a task row asks to generate, or None if it names no generation parameters.

    Unset fields may be None (a `datasets.Dataset` fills missing columns with None). Raises ValueError naming the
    field at fault.
    """
    challenge = task.get("challenge")
    custom = {name: task.get(name) for name in CUSTOM_FIELDS}
    if challenge is None and all(value is None for value in custom.values()):
        return None
    if task.get("seed") is None:
        raise ValueError("the row has generation parameters but no `seed`: add an integer `seed`, e.g. 0")
    seed = check_seed(task["seed"])
    if challenge is not None:
        if not isinstance(challenge, str):
            raise ValueError(f"`challenge` must be a challenge name such as 'tw-simple', got {challenge!r}")
        names = challenge_setting_names(challenge)
        settings = {name: task[name] for name in names if task.get(name) is not None}
        return ChallengeGameSpec.create(challenge, **settings), seed
    missing = [name for name, value in custom.items() if value is None]
    if missing:
        raise ValueError(f"a custom game needs all of {', '.join(CUSTOM_FIELDS)}; missing: {', '.join(missing)}")
    return CustomGameSpec(**custom), seed
