"""TextWorldEnv on the real engine: walkthroughs win, a lost game is not a win, observations are clean."""

import json
import re
from functools import partial

import pytest
from conftest import follow_the_expert
from textworld.core import GameNotRunningError

from trl_multiturn.envs import TaskError, TextWorldEnv, check_environment
from trl_multiturn.envs.textworld.commands import MAX_ACTION_CHARS, normalize_action
from trl_multiturn.envs.textworld.env import TextWorldConfig, clean_observation
from trl_multiturn.envs.textworld.games import CustomGameSpec, game_path

# TextWorld silences this Jericho warning at import; pytest re-enables warnings per test.
pytestmark = pytest.mark.filterwarnings("ignore::jericho.UnsupportedGameWarning")

CUSTOM = [{"world_size": 2, "nb_objects": 3, "quest_length": 4, "seed": seed} for seed in (0, 1)]
SIMPLE = [{"challenge": "tw-simple", "rewards": rewards, "goal": "detailed", "seed": 0}
          for rewards in ("dense", "sparse")]
STATUS_LINE = re.compile(r"-= .* =-\s*-?\d+/\d+")


@pytest.fixture(scope="session")
def games_dir(tmp_path_factory):
    """One game cache for the session, shared with test_textworld_games.py: each game is generated once."""
    return tmp_path_factory.getbasetemp() / "textworld_games"


@pytest.fixture
def env(games_dir):
    env = TextWorldEnv(games_dir=str(games_dir))
    yield env
    env.close()


def _assert_clean(observation):
    assert observation.strip()
    assert not any(line.lstrip().startswith(">") for line in observation.splitlines()), observation
    assert not STATUS_LINE.search(observation), observation
    assert "$$" not in observation and "RESTART" not in observation, observation
    assert "<score>" not in observation and not re.search(r"\[[a-z]", observation), observation  # TextWorld's tags


def _task_id(task):
    return f"{task.get('challenge', 'custom')}-{task.get('rewards', '')}{task['seed']}"


def _eat_the_food(env, task):
    """tw-simple's lose condition: the walkthrough up to its last action, then eating the food that should go on
    the stove."""
    *steps, put_on_stove = env.expert_actions(task)
    return [*steps, f"eat {re.fullmatch(r'put (.+) on stove', put_on_stove).group(1)}"]


@pytest.mark.parametrize("task", CUSTOM + SIMPLE, ids=_task_id)
def test_textworld_meets_the_environment_contract(env, games_dir, task):
    """The walkthrough wins, eating the food loses and is not a win, bad rows raise TaskError, and the rest of
    `check_environment`."""
    losing = _eat_the_food(env, task) if task.get("challenge") == "tw-simple" else None
    passed = check_environment(partial(TextWorldEnv, games_dir=str(games_dir)), task, losing_actions=losing,
                               bad_tasks=[{}, {"game_file": "/nowhere/game.z8"}, {**task, "seed": -1}])
    assert ("the losing actions lose, and a loss is not a win" in passed) == (losing is not None)


@pytest.mark.parametrize("task", CUSTOM + SIMPLE, ids=_task_id)
def test_walkthrough_is_clean_and_scores_in_full(env, task):
    first = env.reset(task)
    _assert_clean(first)
    actions = env.expert_actions(task)
    results = [env.step(action) for action in actions]
    for result in results:
        _assert_clean(result.observation)
    last = results[-1]
    assert last.won and not last.info["lost"]
    assert sum(r.reward for r in results) == last.info["max_score"] == last.info["score"] > 0
    if task.get("rewards") == "sparse":
        assert [r.reward for r in results] == [0.0] * (len(actions) - 1) + [1.0]


def test_first_observation_is_objective_and_room(env):
    game_file = env.game_file(CUSTOM[0])
    objective = json.loads(game_file.with_suffix(".json").read_text())["objective"]
    first = env.reset(CUSTOM[0])
    assert first.startswith(objective)
    assert re.search(r"^-= .+ =-$", first, re.MULTILINE)  # the room's title line follows the objective


def test_eating_the_food_is_reported_as_lost(env):
    task = SIMPLE[0]
    env.reset(task)
    *steps, eat = _eat_the_food(env, task)
    for action in steps:
        env.step(action)
    lost = env.step(eat)
    assert lost.done and not lost.won and lost.info["lost"]
    assert lost.info["score"] < lost.info["max_score"]
    assert "You lost" in lost.observation


def test_invalid_action_is_answered_and_the_game_goes_on(env):
    task = CUSTOM[0]
    env.reset(task)
    # Control characters and interpreter escapes included: \x14 or a reply starting with \q would leave the
    # interpreter waiting forever.
    for nonsense in ("dance with the teapot", "xyzzy", "", "sing\nand dance", "\x14\x00\x08 sing", "\U0001F600",
                     "caf\u00e9 " * 100, "\\q", "\\help", "take \\p key"):
        result = env.step(nonsense)
        assert result.reward == 0.0 and not result.done and not result.won
        _assert_clean(result.observation)
    assert env.step("blorp").observation == "That's not a verb I recognise."
    results = [env.step(action) for action in env.expert_actions(task)]
    assert results[-1].won


def test_actions_become_one_line_of_printable_ascii():
    assert normalize_action("  take  the\tcaf\u00e9\nkey\x14 ") == "take the cafe key"
    assert normalize_action("\U0001F600 look\x7f") == "look"
    assert normalize_action("\\help me") == "help me"
    assert len(normalize_action("a" * 1000)) == MAX_ACTION_CHARS


@pytest.mark.parametrize("task", [CUSTOM[0], SIMPLE[0]], ids=["custom", "tw-simple"])
def test_a_chained_reply_is_played_and_scored_in_full(env, task):
    """TextWorld keeps a reply's first `<score>` tag and cuts its text up to the last one: after "a. b then c" it
    would report the score and text of "a" alone. The env reports what the whole chain did."""
    env.reset(task)
    actions = env.expert_actions(task)
    single = [env.step(action) for action in actions]
    env.reset(task)
    half = len(actions) // 2
    replies = [". ".join(actions[:half]), " then ".join(actions[half:])]
    assert max(map(len, replies)) <= MAX_ACTION_CHARS
    chained = [env.step(reply) for reply in replies]
    for result, played in zip(chained, (single[half - 1], single[-1])):
        assert (result.info["score"], result.info["moves"]) == (played.info["score"], played.info["moves"])
        _assert_clean(result.observation)
    assert [r.done for r in chained] == [False, True] and chained[-1].won
    assert sum(r.reward for r in chained) == chained[-1].info["max_score"] > 0
    for played, reply in zip(single, [chained[0]] * half + [chained[1]] * (len(actions) - half)):
        assert played.observation.splitlines()[0] in reply.observation


def test_admissible_commands_only_with_the_flag(games_dir):
    task = CUSTOM[0]
    plain = TextWorldEnv(games_dir=str(games_dir))
    hinted = TextWorldEnv(TextWorldConfig(admissible_commands_in_observation=True, games_dir=str(games_dir)))
    try:
        assert "Admissible commands" not in plain.reset(task)
        observation = hinted.reset(task)
        step = plain.step("look")
        assert "look" in step.info["admissible_commands"]
        assert "Admissible commands" not in step.observation
        hinted_step = hinted.step("look")
        assert hinted_step.info["admissible_commands"] == step.info["admissible_commands"]
        listed = hinted_step.observation.split("Admissible commands: ")[1]
        assert listed == ", ".join(step.info["admissible_commands"])
        assert "Admissible commands: " in observation
    finally:
        plain.close()
        hinted.close()


def test_switching_games_closes_the_old_engine(env):
    env.reset(CUSTOM[0])
    engine = env._engine
    env.reset(CUSTOM[0])
    assert env._engine is engine  # same game: the engine is reused
    env.reset(SIMPLE[0])
    assert env._engine is not engine
    with pytest.raises(GameNotRunningError):  # the old engine was closed
        engine.step("look")
    assert [env.step(a) for a in env.expert_actions(SIMPLE[0])][-1].won
    env.reset(CUSTOM[0])
    assert [env.step(a) for a in env.expert_actions(CUSTOM[0])][-1].won


def test_step_outside_an_episode_is_an_error(env):
    with pytest.raises(RuntimeError, match="reset"):
        env.step("look")
    env.reset(CUSTOM[0])
    for action in env.expert_actions(CUSTOM[0]):
        env.step(action)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("look")


def test_row_with_a_missing_file_but_its_spec_regenerates(env, games_dir, tmp_path):
    row = {"game_file": str(tmp_path / "elsewhere.z8"), **CUSTOM[1]}
    assert env.game_file(row) == game_path(CustomGameSpec(2, 3, 4), 1, games_dir)
    by_name = {"game_file": game_path(CustomGameSpec(2, 3, 4), 1, games_dir).name}  # relative to games_dir
    assert env.game_file(by_name) == env.game_file(row)
    assert env.reset(by_name) == env.reset(CUSTOM[1])


@pytest.mark.parametrize("task, message", [
    ("w2-o3-q4", "must be a dict"),
    ({}, "names no game"),
    ({"game_file": "/nowhere/game.z8"}, "make-games"),
    ({"game_file": 3}, "game_file"),
    ({"world_size": 2, "nb_objects": 3, "quest_length": 4}, "seed"),
    ({"world_size": 2, "quest_length": 4, "seed": 0}, "nb_objects"),
    ({"world_size": "two", "nb_objects": 3, "quest_length": 4, "seed": 0}, "world_size"),
    ({"world_size": 2, "nb_objects": 3, "quest_length": 4, "seed": -1}, "seed"),
    ({"challenge": "tw-simple", "rewards": "lots", "goal": "brief", "seed": 0}, "rewards"),
    ({"challenge": "tw-simple", "rewards": "dense", "seed": 0}, "goal"),
    ({"challenge": "tw-nothing", "seed": 0}, "tw-simple"),
])
def test_bad_task_rows_raise_task_error(env, task, message):
    with pytest.raises(TaskError, match=message):
        env.reset(task)


def test_clean_observation_strips_prompt_status_banner_and_menu():
    raw = ("\n\n  ________  __\n |        \\|  \\\n  \\$$$$$$$$| $$\n\nWelcome!\n\n-= Lounge =-\nA room.\n\n>"
           "                         -= Lounge =-0/1")
    assert clean_observation(raw) == "Welcome!\n\n-= Lounge =-\nA room."
    end = ("\nYou win.\n\n      *** The End ***\n\nWould you like to RESTART, RESTORE a saved game, QUIT or UNDO the "
           "last command?\n>                 -= Kitchen =-3/12")
    assert clean_observation(end) == "You win.\n\n*** The End ***"


def test_the_per_state_expert_wins_from_a_state_off_the_walkthrough(env):
    """`expert_action` is TextWorld's plan from where the player stands: after a detour it leads back and wins, it is
    the walkthrough's first command at the start, and None once the game is over."""
    task = CUSTOM[0]
    env.reset(task)
    assert env.expert_action() == env.expert_actions(task)[0]
    env.step("inventory")
    env.step("go nowhere")
    actions, result = follow_the_expert(env, 20)
    assert result.won and result.done and env.expert_action() is None
    assert actions == env.expert_actions(task)  # this game's shortest plan is its walkthrough

