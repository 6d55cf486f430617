"""`TextWorldEnv`: text games played on the real TextWorld engine (Inform 7 stories run by Jericho's Z-machine).

A task row names one game, in one of three forms:

* `{"game_file": "games/tw-custom-w2-o3-q4-seed7.z8"}`: a compiled game (its `.json` must sit next to it);
* `{"world_size": 2, "nb_objects": 3, "quest_length": 4, "seed": 7}`: one of the paper's `custom` games;
* `{"challenge": "tw-simple", "rewards": "dense", "goal": "detailed", "seed": 7}`: a TextWorld challenge game.

Generated games are made on first use and cached in `games_dir`. A row may carry both a `game_file` and its
generation parameters (as `trl_multiturn.data.textworld_tasks` writes them): the file is used when it exists, and
regenerated from the parameters when it does not (e.g. on another machine).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import textworld

from ...cache import cache_dir
from ...config_checks import check_fields
from ..base import Environment, StepResult, TaskError
from .commands import normalize_action, refused_word
from .games import GameGenerationError, generate_game, is_complete, spec_from_task, walkthrough

TASK_FORMATS = (
    '{"game_file": "path/to/game.z8"}, '
    '{"world_size": 2, "nb_objects": 3, "quest_length": 4, "seed": 0}, or '
    '{"challenge": "tw-simple", "rewards": "dense", "goal": "detailed", "seed": 0}'
)


def default_games_dir() -> Path:
    """`cache_dir("textworld_games")`: `$TRL_MULTITURN_CACHE/textworld_games`, else
    `~/.cache/trl_multiturn/textworld_games` (see `trl_multiturn.cache`)."""
    return cache_dir("textworld_games")


@dataclass
class TextWorldConfig:
    """Options of `TextWorldEnv`.

    Parameters:
        > Parameters that control the observation

        admissible_commands_in_observation (`bool`, defaults to `False`):
            Append the game's admissible commands to every observation (the paper plays without).

        > Parameters that control the games

        games_dir (`str`, *optional*):
            Folder where games generated from task rows are cached (default: the package's cache folder).
    """

    # Parameters that control the observation
    admissible_commands_in_observation: bool = field(
        default=False,
        metadata={"help": "Append the game's admissible commands to every observation. Off by default: the paper "
                          "plays without action hints. The commands are always in `StepResult.info`."},
    )

    # Parameters that control the games
    games_dir: str | None = field(
        default=None,
        metadata={"help": "Folder where games generated from task rows are cached. Default: "
                          "$TRL_MULTITURN_CACHE/textworld_games, else ~/.cache/trl_multiturn/textworld_games."},
    )

    def __post_init__(self):
        check_fields(self)


# The banner printed at the start of a story: lines drawn only with these characters.
_BANNER_LINE = re.compile(r"^[ _|\\/$<>]*[_|\\/$][ _|\\/$<>]*$", re.MULTILINE)
# The prompt `>` and the status line ("-= Kitchen =-3/12": room, score/moves) the interpreter prints after it.
_STATUS = re.compile(r"[ \t]*>?[ \t]*-= [^\n]*=-[ \t]*-?\d+/\d+\s*$")
_PROMPT = re.compile(r"^>[ \t]*$", re.MULTILINE)
_END_QUESTION = re.compile(r"Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command\?")
# TextWorld turns on Inform's action trace ("[opening the box]") and a score and moves tag after every turn.
_TRACE_TAG = re.compile(r"\[[^\]]+\]\n?")
_TURN_TAGS = re.compile(r"<(score|moves)>\n(-?\d+)\n</\1>")


def last_turn_tag(output: str, name: str, default: int) -> int:
    """The last `<score>` or `<moves>` tag (`name`) in the story's raw `output`: its value after the whole reply.

    TextWorld keeps the first tag: after a chained reply ("open box. take key") that is the value after its first
    command, so a chain that wins would score less than the game says. A parser error prints no tag: `default`.
    A reply cannot forge a tag: it spans lines.
    """
    values = [value for tag, value in _TURN_TAGS.findall(output) if tag == name]
    return int(values[-1]) if values else default


def story_text(output: str) -> str:
    """What the story said in its raw `output`, without TextWorld's action trace and turn tags.

    TextWorld's own `feedback` cuts everything from the first `<score>` tag to the last one, which after a chained
    reply is the text of every command but the first.
    """
    return _TURN_TAGS.sub("", _TRACE_TAG.sub("", output))


def clean_observation(text: str) -> str:
    """The story's text without the interpreter's banner, prompt, status line and end-of-game menu."""
    for pattern in (_BANNER_LINE, _STATUS, _PROMPT, _END_QUESTION):
        text = pattern.sub("", text)
    text = "\n".join(line.strip() for line in text.splitlines())  # the engine centres some lines with spaces
    return re.sub(r"\n{3,}", "\n\n", text).strip()


class TextWorldEnv(Environment):
    """One TextWorld game at a time; `reset` with a new game closes the previous one.

    `reward` is the change in the game's score; `won` and `lost` are TextWorld's own (a lost game ends with
    `done=True, won=False`). `info` holds `score`, `max_score`, `moves`, `lost`, `admissible_commands` and `game_file`.

    A reply is one line of printable ASCII (`normalize_action`). Replies that would act on the interpreter, its files
    or TextWorld's state tracker rather than the story (`restart`, `me, quit`, `look. save`, `g`, `tw-print`, ...)
    never reach the game: they are answered "The command '...' is not available in this game." and change nothing.
    `commands.py` lists what is refused and what passes, and why. A reply may chain commands
    ("open box. take key"): the story plays them in turn, the observation has each one's text and the reward is
    what the whole chain scored; TextWorld's tracker, and so `admissible_commands`, sees only part of such a reply.

    Build it with a config or its fields: `TextWorldEnv()`, `TextWorldEnv(games_dir="games")`,
    `TextWorldEnv(TextWorldConfig(admissible_commands_in_observation=True))`.
    """

    def __init__(self, config: TextWorldConfig | None = None, **kwargs: Any):
        if config is not None and kwargs:
            raise TypeError("pass either a TextWorldConfig or its fields as keyword arguments, not both")
        self.config = config if config is not None else TextWorldConfig(**kwargs)
        self.games_dir = Path(self.config.games_dir) if self.config.games_dir else default_games_dir()
        self._request_infos = textworld.EnvInfos(feedback=True, won=True, lost=True, score=True, max_score=True,
                                                 moves=True, admissible_commands=True,
                                                 policy_commands=True)
        self._engine = None
        self._state = None  # the engine's last GameState
        self._game_file: Path | None = None
        self._score = 0
        self._moves = 0
        self._over = True

    def game_file(self, task: Mapping[str, Any]) -> Path:
        """The game `task` names, generated into `games_dir` first if needed. Raises TaskError for a bad row."""
        if not isinstance(task, Mapping):
            raise TaskError(f"a TextWorld task must be a dict, got {type(task).__name__}; pass {TASK_FORMATS}")
        given = task.get("game_file")
        if given is not None:
            if not isinstance(given, (str, os.PathLike)):
                raise TaskError(f"`game_file` must be a path to a .z8 game, got {given!r}")
            for candidate in (Path(given), self.games_dir / given):
                if is_complete(candidate):
                    return candidate
        try:
            spec = spec_from_task(task)
        except ValueError as exc:
            raise TaskError(f"bad TextWorld task row: {exc}. Task rows look like {TASK_FORMATS}") from None
        if spec is None:
            if given is not None:
                raise TaskError(
                    f"`game_file` {str(given)!r} was not found (a game needs its .z8 and the .json next to it, here "
                    f"or under games_dir {str(self.games_dir)!r}): generate it with `trl-multiturn make-games` or "
                    "add its generation parameters to the row"
                )
            raise TaskError(f"the task row {dict(task)!r} names no game: pass {TASK_FORMATS}")
        try:
            return generate_game(*spec, self.games_dir)
        except GameGenerationError as exc:
            raise TaskError(f"cannot generate the game of this task row: {exc}") from None

    def reset(self, task: dict) -> str:
        game_file = self.game_file(task)
        if game_file != self._game_file:
            self.close()
            self._engine = textworld.start(str(game_file), self._request_infos)
            self._game_file = game_file
        state = self._state = self._engine.reset()
        self._score = state.score or 0
        self._moves = state.moves or 0
        self._over = False
        return self._observation(state.feedback, state.admissible_commands)

    def step(self, action: str) -> StepResult:
        if self._over:
            raise RuntimeError("the episode is over (or never started): call reset(task) before step()")
        action = normalize_action(action)
        refused = refused_word(action)
        if refused is not None:  # the story never sees it: nothing changes, no question is left pending
            observation = f"The command '{refused}' is not available in this game."
            return StepResult(self._observation(observation, self._state.admissible_commands),
                              info=self._info(self._state))
        state, _, engine_done = self._engine.step(action)
        self._state = state
        output = state.get("raw") or ""
        score = last_turn_tag(output, "score", default=self._score)
        self._moves = last_turn_tag(output, "moves", default=self._moves)
        reward = score - self._score
        self._score = score
        won = bool(state.won)
        self._over = won or bool(state.lost) or bool(engine_done)
        return StepResult(
            observation=self._observation(story_text(output), state.admissible_commands),
            reward=float(reward),
            done=self._over,
            won=won,
            info=self._info(state),
        )

    def expert_actions(self, task: dict) -> list[str]:
        """The game's walkthrough (the commands that win it from the start)."""
        return walkthrough(self.game_file(task))

    def expert_action(self) -> str | None:
        """The first command of TextWorld's winning policy from the current state (its quest tracker's plan), or None
        once the episode is over or the game can no longer be won.

        The tracker follows the commands that reached the story: after a chained reply ("open box. take key") it has
        seen only part of the reply (as `admissible_commands`), so its plan can lag the story by a command there.
        """
        if self._over:
            return None
        commands = self._state.policy_commands
        return commands[0] if commands else None

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
        self._engine = None
        self._state = None
        self._game_file = None
        self._over = True

    def _observation(self, text: str, admissible_commands: list[str]) -> str:
        text = clean_observation(text)
        if self.config.admissible_commands_in_observation:
            text += "\n\nAdmissible commands: " + ", ".join(admissible_commands)
        return text

    def _info(self, state) -> dict[str, Any]:
        return {
            "score": self._score,
            "max_score": state.max_score,
            "moves": self._moves,
            "lost": bool(state.lost),
            "admissible_commands": list(state.admissible_commands),
            "game_file": str(self._game_file),
        }
