"""`ALFWorldEnv`: ALFWorld's household tasks, played in its own text engine."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from pathlib import Path

from ...config_checks import Range, check_fields, config_field
from ..base import Environment, StepResult, TaskError
from .engine import EXPERT_TYPES, ExpertFailed, make_engine, play_expert, seeded_random
from .tasks import TRAJ_FILE, read_game, resolve_game_file

logger = logging.getLogger(__name__)


@dataclass
class ALFWorldConfig:
    """Settings of `ALFWorldEnv`; pass them as `ALFWorldEnv(ALFWorldConfig(...))` or as keywords.

    Parameters:
        > Parameters that control the games

        data_path (`str`, *optional*):
            Folder that relative `game_file` paths in task rows resolve against (`$ALFWORLD_DATA`).

        > Parameters that control the observation

        admissible_commands (`bool`, defaults to `False`):
            Append the engine's admissible commands to every observation.

        > Parameters that control the expert

        expert_type (`str`, defaults to `"handcoded"`):
            Expert behind `expert_actions` and `expert_action`: 'handcoded' (ALFWorld's) or 'planner'.
        expert_max_steps (`int`, defaults to `200`):
            Step budget of the hand-coded expert before it counts as failed.
    """

    # Parameters that control the games
    data_path: str | None = field(
        default=None,
        metadata={
            "help": "Folder that relative `game_file` paths in task rows resolve against: `$ALFWORLD_DATA` or its "
            "`json_2.1.1` folder. None: relative paths resolve against the working directory."
        },
    )

    # Parameters that control the observation
    admissible_commands: bool = field(
        default=False,
        metadata={
            "help": "Append the engine's admissible commands to every observation ('Admissible actions: go to "
            "cabinet 1, ...'). They are in `StepResult.info['admissible_commands']` either way."
        },
    )

    # Parameters that control the expert
    expert_type: str = field(
        default="handcoded",
        metadata={
            "help": "Expert behind `expert_actions` and `expert_action`: 'handcoded' (ALFWorld's expert, which "
            "searches the room as an agent must; the games' stored walkthroughs come from it) or 'planner' (Fast "
            "Downward's shortest plan, which knows where everything is and never searches)."
        },
    )
    expert_max_steps: int = config_field(
        200, "Step budget of the hand-coded expert before it counts as failed.", range=Range(ge=1))

    def __post_init__(self):
        check_fields(self)
        if self.expert_type not in EXPERT_TYPES:
            raise ValueError(f"ALFWorldConfig.expert_type={self.expert_type!r}: use one of {EXPERT_TYPES}.")


class ALFWorldEnv(Environment):
    """ALFWorld (Shridhar et al., 2021) over TextWorld's PDDL engine, with ALFWorld's demangler and infos.

    A task row names a game: `{"game_file": ".../json_2.1.1/train/<task>/<trial>/game.tw-pddl"}` (see `list_tasks`
    and `trl-multiturn make-games --env alfworld`). The first observation describes the room and ends with the goal
    ("Your task is to: ..."); `won` is the engine's own goal check, and the reward is 1 on the winning step.
    Actions are matched against the engine's admissible commands after lower-casing and collapsing whitespace;
    anything else answers "Nothing happens.".

    Args:
        config: an `ALFWorldConfig`; or give its fields as keywords, e.g. `ALFWorldEnv(admissible_commands=True)`.
    """

    def __init__(self, config: ALFWorldConfig | None = None, **kwargs):
        if config is not None and kwargs:
            raise TypeError("Give ALFWorldEnv either an ALFWorldConfig or its fields as keywords, not both.")
        known = {f.name for f in fields(ALFWorldConfig)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"ALFWorldEnv got unknown settings {unknown}; ALFWorldConfig has {sorted(known)}.")
        self.config = config if config is not None else ALFWorldConfig(**kwargs)
        self._engine = None
        self._loaded: Path | None = None
        self._score = 0.0
        self._expert_plans: dict[Path, list[str]] = {}
        self._played: list[str] = []  # this episode's actions, for the expert's engine to follow
        self._expert_engine = None
        self._expert_state = None  # the expert engine's state after `_expert_steps` of `_played`
        self._expert_steps: int | None = None  # None: the expert engine has not started this episode
        self._done = True

    def reset(self, task: dict) -> str:
        path = resolve_game_file(task, self.config.data_path)
        if self._engine is None:
            self._engine = make_engine()
        if path != self._loaded:
            read_game(path)  # clear TaskError for a file that is not a compiled game, before the engine sees it
            self._loaded = None
            self._engine.load(str(path))
            self._loaded = path
        state = self._engine.reset()
        self._score = 0.0
        self._played, self._expert_steps, self._done = [], None, False
        return self._observation(state)

    def step(self, action: str) -> StepResult:
        if self._loaded is None:
            raise RuntimeError("ALFWorldEnv.step called before reset(task).")
        action = " ".join(action.lower().split())
        state, score, done = self._engine.step(action)
        self._played.append(action)
        self._done = bool(done)
        reward, self._score = float(score) - self._score, float(score)
        info = {"admissible_commands": list(state["admissible_commands"]), "game_file": str(self._loaded)}
        return StepResult(self._observation(state), reward=reward, done=bool(done), won=bool(state["won"]), info=info)

    def _observation(self, state) -> str:
        text = state.feedback.strip()
        if self.config.admissible_commands:
            text += "\n\nAdmissible actions: " + ", ".join(state["admissible_commands"]) + "."
        return text

    def expert_actions(self, task: dict) -> list[str]:
        """The expert's winning actions for `task`, for SFT warm starts.

        With the hand-coded expert, a game's stored `walkthrough` (written by `alfworld-generate` and by
        `make-games`) is used when present; otherwise the expert plays the game (a second or two), seeded, so the
        plan is the same on every call.
        """
        path = resolve_game_file(task, self.config.data_path)
        if path not in self._expert_plans:
            walkthrough = read_game(path).get("walkthrough")
            if self.config.expert_type == "handcoded" and walkthrough:
                self._expert_plans[path] = list(walkthrough)
            else:
                if self.config.expert_type == "handcoded" and not (path.parent / TRAJ_FILE).is_file():
                    raise TaskError(
                        f"'game_file'={str(path)!r}: the hand-coded expert needs {TRAJ_FILE} beside the game "
                        "(ALFWorld's dataset layout); restore it or use ALFWorldConfig(expert_type='planner')."
                    )
                try:
                    plan = play_expert(path, self.config.expert_type, self.config.expert_max_steps)
                except ExpertFailed as err:
                    raise TaskError(f"'game_file'={str(path)!r}: no expert plan ({err}).") from err
                self._expert_plans[path] = plan
        return list(self._expert_plans[path])

    def expert_action(self) -> str | None:
        """The expert's next action from the current state (`expert_type`), or None once the episode is over.

        The expert runs on an engine of its own, started at the first call of an episode and then stepped with the
        episode's actions (the training engine stays without the expert's per-step cost), each step seeded by its
        index so that the hand-coded expert's choices are the same on every replay.
        """
        if self._loaded is None:
            raise RuntimeError("ALFWorldEnv.expert_action called before reset(task).")
        if self._done:
            return None
        if self._expert_steps is None:
            if self._expert_engine is None:
                self._expert_engine = make_engine(self.config.expert_type)
            with seeded_random(0):
                self._expert_engine.load(str(self._loaded))
                self._expert_state = self._expert_engine.reset()
            self._expert_steps = 0
        try:
            for k in range(self._expert_steps, len(self._played)):
                with seeded_random(k + 1):
                    self._expert_state, _, _ = self._expert_engine.step(self._played[k])
                self._expert_steps = k + 1
            plan = self._expert_state["extra.expert_plan"]
        except Exception as err:  # noqa: BLE001 - ALFWorld's expert signals dead ends with plain exceptions
            logger.warning("ALFWorld's %s expert has no action after %d actions of %s (%r): state left unlabelled",
                           self.config.expert_type, len(self._played), self._loaded, err)
            self._expert_steps = None  # its engine starts the episode again at the next call
            return None
        return plan[0] if plan else None

    def close(self) -> None:
        for engine in (self._engine, self._expert_engine):
            if engine is not None:
                engine.close()
        self._engine, self._loaded, self._expert_engine, self._expert_steps, self._done = None, None, None, None, True
