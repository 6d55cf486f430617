"""ALFWorldEnv on a real ALFWorld game: ALFWorld's own dataset layout, engine, goal check and expert."""

import json
import shutil
import sys
from pathlib import Path

import pytest
from conftest import follow_the_expert

from trl_multiturn.envs import ALFWorldEnv, TaskError, check_environment
from trl_multiturn.envs.alfworld import ALFWorldConfig, list_tasks
from trl_multiturn.model_card import recipe_from_argv

# One trial of ALFWorld's training set (MIT licence, see fixtures/alfworld/README.md), shipped with the tests.
FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "alfworld"
GOAL = "heat some potato and put it in sinkbasin"


@pytest.fixture(scope="module")
def row():
    if not sorted(FIXTURE.glob("json_2.1.1/train/*/*/game.tw-pddl")):
        pytest.fail(
            f"The real ALFWorld game fixture is missing: expected json_2.1.1/train/<task>/<trial>/game.tw-pddl under "
            f"{FIXTURE}."
        )
    tasks = list_tasks(FIXTURE)
    assert len(tasks) == 1
    return tasks[0]


@pytest.fixture(scope="module")
def env():
    environment = ALFWorldEnv()
    yield environment
    environment.close()


@pytest.fixture(scope="module")
def handcoded_plan(env, row):
    return env.expert_actions(row)


def test_fixture_is_listed_from_the_dataset_layout(row):
    assert row["task_type"] == "pick_heat_then_place_in_recep"
    assert row["split"] == "train"
    assert row["goal"] == GOAL
    assert row["game_file"].endswith("trial_T20190908_231731_054988/game.tw-pddl")


def test_alfworld_meets_the_environment_contract(row):
    """The expert plan wins through `step`, bad rows raise TaskError, and the rest of `check_environment` (ALFWorld
    has no lose condition: a nonsense action is checked not to win)."""
    passed = check_environment(ALFWorldEnv, row, bad_tasks=[{}, {"game_file": "/nowhere/game.tw-pddl"}])
    assert "the expert wins through step" in passed


def test_expert_plan_played_through_step_scores_only_at_the_end(env, row, handcoded_plan):
    plan = handcoded_plan
    assert plan[-1].startswith("move potato") and plan[-1].endswith("to sinkbasin 1")
    assert any(action.startswith("heat potato") for action in plan)

    observation = env.reset(row)
    assert observation.startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert observation.endswith(f"Your task is to: {GOAL}.")
    assert "a microwave 1" in observation and "Admissible actions" not in observation
    for action in plan[:-1]:
        result = env.step(action)
        assert (result.done, result.won, result.reward) == (False, False, 0.0), action
        assert result.observation != "Nothing happens.", f"expert action {action!r} was not admissible"
    result = env.step(plan[-1])
    assert (result.done, result.won, result.reward) == (True, True, 1.0)
    assert result.observation.startswith("You move the potato")


def test_unknown_actions_do_nothing_and_are_not_wins(env, row):
    env.reset(row)
    result = env.step("fly to the moon")
    assert result.observation == "Nothing happens."
    assert (result.done, result.won, result.reward) == (False, False, 0.0)
    # Case and spacing are normalised before matching the engine's admissible commands.
    result = env.step("  Go to   MICROWAVE 1 ")
    assert result.observation.startswith("You arrive at microwave 1.")
    assert "open microwave 1" in result.info["admissible_commands"]


# What acts outside a TextWorld story (see test_textworld_commands.py), and a chain of real commands. ALFWorld's
# steps cost a quarter of a second each (admissible commands are recomputed): one of each kind.
META_ATTACKS = ["me, restart", "y", "q", "undo", "save", "restore", "g", "look. restart", "tw-trace-actions", "\\q",
                ",,,", "x" * 5000, "go to sinkbasin 1. move potato 1 to sinkbasin 1"]
IN_WORLD_VERBS = {"go", "open", "close", "take", "move", "put", "examine", "use", "heat", "clean", "cool", "slice",
                  "look", "inventory", "help"}


def test_meta_commands_do_nothing_and_the_expert_still_wins(env, row, handcoded_plan, tmp_path, monkeypatch):
    """ALFWorld's engine plays a command only if it is one of its admissible commands, word for word, and none of
    those acts outside the world: interpreter commands and chains do nothing, and the plan still wins."""
    monkeypatch.chdir(tmp_path)
    env.reset(row)
    verbs = set()
    for index, action in enumerate(handcoded_plan[:-1]):
        if index == len(handcoded_plan) // 2:  # midway, with progress to lose
            for attack in META_ATTACKS:
                result = env.step(attack)
                assert (result.observation, result.done, result.won, result.reward) == (
                    "Nothing happens.", False, False, 0.0), attack
        result = env.step(action)
        assert result.observation != "Nothing happens.", action
        verbs |= {command.split()[0] for command in result.info["admissible_commands"]}
    assert verbs <= IN_WORLD_VERBS and {"go", "take", "heat", "move"} <= verbs
    assert list(tmp_path.iterdir()) == []
    result = env.step(handcoded_plan[-1])
    assert (result.done, result.won, result.reward) == (True, True, 1.0)


def test_admissible_commands_in_observation_on_request(row):
    env = ALFWorldEnv(ALFWorldConfig(admissible_commands=True))
    first = env.reset(row)
    assert "\n\nAdmissible actions: " in first and "go to microwave 1" in first.rsplit("Admissible actions:", 1)[1]
    result = env.step("go to microwave 1")
    listed = result.observation.rsplit("Admissible actions: ", 1)[1].rstrip(".").split(", ")
    assert listed == result.info["admissible_commands"]
    env.close()


def test_relative_game_file_resolves_against_data_path(row):
    relative = Path(row["game_file"]).relative_to(FIXTURE / "json_2.1.1")
    env = ALFWorldEnv(data_path=str(FIXTURE))
    assert env.reset({"game_file": str(relative)}).endswith(f"Your task is to: {GOAL}.")
    env.close()


@pytest.mark.parametrize(
    "task, message",
    [
        ("train/some/game.tw-pddl", "must be a dict"),
        ({"seed": 3}, "no 'game_file' field"),
        ({"game_file": 42}, "'game_file' must be a path"),
        ({"game_file": "/nowhere/game.tw-pddl"}, "no such file"),
        ({"game_file": "relative/game.tw-pddl"}, "set ALFWorldConfig.data_path"),
        ({"game_file": str(FIXTURE / "README.md")}, "is not a game.tw-pddl file"),
    ],
)
def test_bad_rows_name_the_field_and_the_fix(env, task, message):
    with pytest.raises(TaskError, match=message) as info:
        env.reset(task)
    assert "list_tasks" in str(info.value)


def test_broken_game_files_are_task_errors(tmp_path, row):
    not_json = tmp_path / "a" / "game.tw-pddl"
    not_json.parent.mkdir()
    not_json.write_text("{not json")
    with pytest.raises(TaskError, match="not a readable game.tw-pddl JSON"):
        ALFWorldEnv().reset({"game_file": str(not_json)})
    no_problem = tmp_path / "b" / "game.tw-pddl"
    no_problem.parent.mkdir()
    no_problem.write_text(json.dumps({"pddl_domain": "", "grammar": ""}))
    with pytest.raises(TaskError, match=r"lacks \['pddl_problem'\]"):
        ALFWorldEnv().reset({"game_file": str(no_problem)})
    # The hand-coded expert reads traj_data.json beside the game: without it, a clear error.
    alone = tmp_path / "c" / "game.tw-pddl"
    alone.parent.mkdir()
    shutil.copy(row["game_file"], alone)
    with pytest.raises(TaskError, match="needs traj_data.json"):
        ALFWorldEnv().expert_actions({"game_file": str(alone)})


def test_list_tasks_filters_and_errors(tmp_path):
    with pytest.raises(ValueError, match="no solvable games"):
        list_tasks(FIXTURE, task_types=["pick_two_obj_and_place"])
    with pytest.raises(ValueError, match="unknown"):
        list_tasks(FIXTURE, task_types=["make_coffee"])
    with pytest.raises(ValueError, match="split="):
        list_tasks(FIXTURE, split="dev")
    with pytest.raises(ValueError, match="no 'valid_seen' split"):
        list_tasks(FIXTURE, split="valid_seen")
    with pytest.raises(ValueError, match="alfworld-download"):
        list_tasks(tmp_path)


def test_config_errors():
    with pytest.raises(ValueError, match="expert_type"):
        ALFWorldConfig(expert_type="oracle")
    with pytest.raises(TypeError, match="unknown settings"):
        ALFWorldEnv(max_turns=3)


def test_loading_a_game_in_process_keeps_the_recipe_the_model_card_names(row, monkeypatch):
    """fast_downward sets sys.argv to ["translate.py", "domain", "task"] whenever a game is loaded; the model card's
    recipe comes from the command line as started."""
    command = ["python", "examples/alfworld_grpo.py", "--config", "recipes/alfworld_grpo.yaml"]
    monkeypatch.setattr(sys, "argv", command[1:])
    monkeypatch.setattr(sys, "orig_argv", command)
    environment = ALFWorldEnv()
    try:
        environment.reset(row)
    finally:
        environment.close()
    assert recipe_from_argv() == "recipes/alfworld_grpo.yaml"


def test_the_per_state_expert_leads_back_from_a_detour_and_wins(env, row, handcoded_plan):
    """`expert_action` runs the hand-coded expert from the state the episode reached: after two actions of its own
    the player is led to the goal, and the expert has nothing to say once the game is won."""
    env.reset(row)
    assert env.expert_action() == handcoded_plan[0]
    env.step("go to sinkbasin 1")
    env.step("look")
    actions, result = follow_the_expert(env, 40)
    assert result.won and env.expert_action() is None
    assert actions[-1] == handcoded_plan[-1] and len(actions) <= len(handcoded_plan)

