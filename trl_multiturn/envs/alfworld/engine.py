"""ALFWorld's own text engine, set up the way `alfworld.agents.environment.alfred_tw_env` sets it up.

TextWorld's PDDL backend (`PddlEnv`, Fast Downward underneath) plays a `game.tw-pddl`; ALFWorld's `AlfredDemangler`
turns ids such as `Potato_bar__plus_01_dot_36...` into "potato 2", `AlfredInfos` reports the game file, and
`AlfredExpert` (only where an expert plan is asked for) adds ALFWorld's hand-coded expert or the planner.
"""

from __future__ import annotations

import contextlib
import random
from importlib import resources
from pathlib import Path

EXPERT_TYPES = ("handcoded", "planner")


def _import_engine():
    try:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert, AlfredInfos
        from textworld.envs import PddlEnv
    except ImportError as err:  # the `alfworld` extra is optional (it pulls Fast Downward, GPL-3)
        raise ImportError(
            f"ALFWorld needs the optional `alfworld` extra ({err}). Install it with "
            "`pip install 'trl-multiturn[alfworld]'`."
        ) from err

    class Expert(AlfredExpert):
        """ALFWorld's expert wrapper, telling its hand-coded expert about placements in the words it tracks.

        alfworld 0.4.2's grammar places objects with "move X to Y", but the hand-coded expert updates its inventory
        (and stops re-taking an object it already placed) only on a command containing "put"; without this, it
        loops on pick_two_obj_and_place. Only the expert's bookkeeping sees the rewording, never the game.
        """

        def _gather_infos(self):
            command = self.prev_command
            if command.startswith("move "):
                self.prev_command = "put " + command[len("move ") :]
            try:
                super()._gather_infos()
            finally:
                self.prev_command = command

    return textworld, PddlEnv, AlfredDemangler, AlfredInfos, Expert


def make_engine(expert_type: str | None = None):
    """A TextWorld environment over ALFWorld's PDDL games: demangled names, `won` and admissible commands in its infos.

    With `expert_type` ("handcoded" or "planner") the state also carries `extra.expert_plan`; the hand-coded expert
    needs the game's facts at every step, so training environments are built without it.
    """
    textworld, PddlEnv, AlfredDemangler, AlfredInfos, AlfredExpert = _import_engine()
    extras = ["gamefile"] + (["expert_plan"] if expert_type else [])
    env = PddlEnv(textworld.EnvInfos(won=True, admissible_commands=True, extras=extras))
    env = AlfredInfos(AlfredDemangler(env, shuffle=False))
    if expert_type:
        if expert_type not in EXPERT_TYPES:
            raise ValueError(f"expert_type={expert_type!r}: use one of {EXPERT_TYPES}.")
        env = AlfredExpert(env, expert_type=expert_type)
    return env


def logic_files() -> tuple[str, str]:
    """The `alfred.pddl` domain and `alfred.twl2` grammar that the `alfworld` package ships, as text."""
    data = resources.files("alfworld") / "data"
    return (data / "alfred.pddl").read_text(), (data / "alfred.twl2").read_text()


@contextlib.contextmanager
def seeded_random(seed):
    """Run a block with Python's global `random` seeded, then restore its state.

    ALFWorld's hand-coded expert and its goal templates draw from the global `random`; seeding it around them is
    what makes an expert plan (and a generated game) the same from one run to the next.
    """
    state = random.getstate()
    random.seed(seed)
    try:
        yield
    finally:
        random.setstate(state)


class ExpertFailed(RuntimeError):
    """The expert did not win the game within its step budget."""


def play_expert(game_file: str | Path, expert_type: str = "handcoded", max_steps: int = 200, seed=0) -> list[str]:
    """Play `game_file` with ALFWorld's expert and return the winning actions.

    The hand-coded expert explores as an agent would (opens receptacles, looks around) and needs `traj_data.json`
    beside the game file; the planner (Fast Downward) returns the shortest plan and, knowing the whole state, never
    searches. Raises `ExpertFailed` when the actions do not win within `max_steps`.
    """
    env = make_engine(expert_type)
    try:
        with seeded_random(seed):
            env.load(str(game_file))
            state = env.reset()
            if expert_type == "planner":
                actions = list(state["extra.expert_plan"])
                won = replay(game_file, actions)
            else:
                actions, won = [], False
                while not won and len(actions) < max_steps:
                    action = state["extra.expert_plan"][0]
                    state, _, _ = env.step(action)
                    actions.append(action)
                    won = bool(state["won"])
    except Exception as err:  # ALFWorld's expert signals timeouts and dead ends with plain exceptions
        raise ExpertFailed(f"the {expert_type} expert failed on {game_file}: {err!r}") from err
    finally:
        env.close()
    if not won:
        raise ExpertFailed(f"the {expert_type} expert did not win {game_file} in {max_steps} steps")
    return actions


def replay(game_file: str | Path, actions: list[str]) -> bool:
    """Whether playing `actions` from the start of `game_file` wins it."""
    env = make_engine()
    try:
        env.load(str(game_file))
        state = env.reset()
        for action in actions:
            state, _, done = env.step(action)
            if done:
                break
        return bool(state["won"])
    finally:
        env.close()
