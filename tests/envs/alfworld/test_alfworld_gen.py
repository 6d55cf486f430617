"""The offline ALFWorld generator: solvable games of all six task types, in ALFWorld's layout, same seed same game."""

import dataclasses
import json
import re
from pathlib import Path

import pytest

from trl_multiturn.commands.cli import main
from trl_multiturn.envs import ALFWorldEnv
from trl_multiturn.envs.alfworld import TASK_TYPES, list_tasks
from trl_multiturn.envs.alfworld.generator import ALFWorldGenConfig, generate_game, generate_games

SEEDS = (0, 1)
TRIAL_FILES = ("game.tw-pddl", "initial_state.pddl", "traj_data.json")


@pytest.fixture(scope="module")
def games_dir(tmp_path_factory):
    """Two games of each task type, made by `trl-multiturn make-games --env alfworld`."""
    out = tmp_path_factory.mktemp("alfworld-games")
    assert main(["make-games", "--env", "alfworld", "--out", str(out), "--seeds", "0-1"]) == 0
    return out


@pytest.fixture(scope="module")
def tasks(games_dir):
    return list_tasks(games_dir)


def _rows(tasks, task_type):
    return [row for row in tasks if row["task_type"] == task_type]


def test_games_are_written_in_the_dataset_layout(games_dir, tasks):
    assert sorted(tasks["task_type"]) == sorted(TASK_TYPES * len(SEEDS))
    for row in tasks:
        trial = Path(row["game_file"]).parent
        assert trial.parent.parent == games_dir / "json_2.1.1" / "train"
        assert all((trial / name).is_file() for name in TRIAL_FILES)
        traj = json.loads((trial / "traj_data.json").read_text())
        params = traj["pddl_params"]
        target = params["parent_target"] or params["toggle_target"]
        assert trial.parent.name == (
            f"{traj['task_type']}-{params['object_target']}-None-{target}-{traj['scene']['scene_num']}"
        )
        game = json.loads((trial / "game.tw-pddl").read_text())
        assert game["solvable"] is True and game["walkthrough"]
        assert game["pddl_problem"] == (trial / "initial_state.pddl").read_text()
        assert row["goal"] == traj["turk_annotations"]["anns"][0]["task_desc"]


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_expert_plans_win_through_the_env(tasks, task_type):
    env = ALFWorldEnv()
    for row in _rows(tasks, task_type):
        plan = env.expert_actions(row)
        observation = env.reset(row)
        assert observation.endswith(f"Your task is to: {row['goal']}.")
        results = [env.step(action) for action in plan]
        assert results[-1].won and results[-1].done and results[-1].reward == 1.0, (row["game_file"], plan)
        assert not any(r.won or r.done for r in results[:-1])
        assert "Nothing happens." not in [r.observation for r in results]
    env.close()


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_same_seed_gives_the_same_game(tasks, task_type, tmp_path):
    row = _rows(tasks, task_type)[0]
    seed = json.loads((Path(row["game_file"]).parent / "traj_data.json").read_text())["generator"]["seed"]
    again = generate_game(task_type, seed).write(tmp_path).parent
    original = Path(row["game_file"]).parent
    assert again.relative_to(tmp_path / "json_2.1.1" / "train") == original.relative_to(original.parents[1])
    for name in TRIAL_FILES:
        assert (again / name).read_bytes() == (original / name).read_bytes(), name


def test_planner_expert_wins_in_fewer_steps_than_the_handcoded_one(tasks):
    row = _rows(tasks, "pick_heat_then_place_in_recep")[0]
    handcoded = ALFWorldEnv().expert_actions(row)
    env = ALFWorldEnv(expert_type="planner")
    plan = env.expert_actions(row)
    assert len(plan) < len(handcoded) and plan != handcoded
    env.reset(row)
    results = [env.step(action) for action in plan]
    assert results[-1].won and not any(r.won for r in results[:-1])
    env.close()


def test_seeds_and_task_types_give_different_games(tasks):
    problems = {Path(row["game_file"]).with_name("initial_state.pddl").read_text() for row in tasks}
    assert len(problems) == len(tasks)


def _facts(problem: str, predicate: str) -> list[str]:
    """First arguments of `predicate` facts in the initial state (the goal's `?variables` excluded)."""
    return re.findall(rf"\({predicate} ([^ ?)][^ )]*)", problem)


def test_complexity_knobs(tasks):
    for row in _rows(tasks, "pick_and_place_simple"):  # default knobs: 8 receptacles, 6 distractors, 2 closed
        problem = Path(row["game_file"]).with_name("initial_state.pddl").read_text()
        assert len(_facts(problem, "openable")) <= 2
        assert len(_facts(problem, "objectType")) <= 1 + 6
    small = generate_game("pick_two_obj_and_place", 3, ALFWorldGenConfig(num_receptacles=3, num_distractors=0))
    assert len(_facts(small.initial_state, "receptacleType")) <= 3
    assert len(_facts(small.initial_state, "objectType")) == 2  # the two targets, nothing else
    big = generate_game("pick_and_place_simple", 3, ALFWorldGenConfig(num_receptacles=12, num_closed=0))
    assert len(_facts(big.initial_state, "receptacleType")) > 3
    assert _facts(big.initial_state, "openable") == []


def test_make_games_reuses_existing_games(games_dir, capsys):
    before = {p: p.stat().st_mtime_ns for p in games_dir.glob("json_2.1.1/train/*/*/game.tw-pddl")}
    assert main(["make-games", "--env", "alfworld", "--out", str(games_dir), "--seeds", "0-1"]) == 0
    assert {p: p.stat().st_mtime_ns for p in games_dir.glob("json_2.1.1/train/*/*/game.tw-pddl")} == before
    assert f"{len(before)} games in {games_dir}" in capsys.readouterr().out


def test_bad_generator_arguments(tmp_path):
    with pytest.raises(ValueError, match="task_type='make_coffee'"):
        generate_game("make_coffee", 0)
    with pytest.raises(ValueError, match="split='test'"):
        generate_games(tmp_path, [0], ["pick_and_place_simple"], split="test")
    with pytest.raises(ValueError, match="num_distractors=-1"):
        ALFWorldGenConfig(num_distractors=-1)


def test_make_games_takes_every_generator_field_with_its_default_and_range(tmp_path, capsys):
    """`make-games --env alfworld` has an option for each `ALFWorldGenConfig` field, with the field's default in its
    help, and the field's range refuses a bad value (no default written twice)."""
    with pytest.raises(SystemExit):
        main(["make-games", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for f in dataclasses.fields(ALFWorldGenConfig):
        assert f"--{f.name.replace('_', '-')}" in text and f"Default: {f.default}." in text
    with pytest.raises(SystemExit):
        main(["make-games", "--env", "alfworld", "--out", str(tmp_path), "--seeds", "0", "--max-attempts", "0"])
    assert "max_attempts=0: give an integer >= 1" in capsys.readouterr().err
