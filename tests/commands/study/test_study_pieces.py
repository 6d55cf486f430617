"""The configuration pieces the paper's studies need: TextWorld shape mixtures, ALFWorld task-type mixtures (train on
some types, evaluate on all), disjoint SFT seeds from a recipe, and the evaluation temperature as a setting."""

import dataclasses
from pathlib import Path

import pytest

from trl_multiturn.data import SEED_RANGES, equal_parts
from trl_multiturn.envs.alfworld.tasks import alfworld_tasks
from trl_multiturn.envs.textworld.tasks import parse_shape, textworld_mixture, textworld_tasks


def test_shapes_parse_and_parts_are_equal():
    assert parse_shape("w2-o3-q4") == (2, 3, 4) and parse_shape("w12-o10-q8") == (12, 10, 8)
    with pytest.raises(ValueError, match="w<rooms>-o<objects>-q<quest length>"):
        parse_shape("2-3-4")
    assert equal_parts(7, 3) == [3, 2, 2] and equal_parts(4, 2) == [2, 2]
    with pytest.raises(ValueError, match="at least one game per part"):
        equal_parts(1, 2)


def test_textworld_mixture_holds_equal_parts_of_each_shape(textworld_games_dir):
    mix = textworld_mixture(["w1-o2-q2", "w2-o3-q4"], split="train", num_games=5, games_dir=textworld_games_dir)
    assert mix["shape"] == ["w1-o2-q2", "w2-o3-q4", "w1-o2-q2", "w2-o3-q4", "w1-o2-q2"]  # 3 + 2, interleaved
    for row in mix:
        assert (row["world_size"], row["nb_objects"], row["quest_length"]) == parse_shape(row["shape"])
        assert f"-{row['shape']}-seed{row['seed']}" in row["game_file"]  # each row's game is of its own shape
    # One shape is exactly the single-shape task set, plus its `shape` column.
    one = textworld_mixture(["w2-o3-q4"], num_games=2, games_dir=textworld_games_dir)
    plain = textworld_tasks(2, 3, 4, num_games=2, games_dir=textworld_games_dir)
    assert [{k: v for k, v in row.items() if k != "shape"} for row in one] == list(plain)
    with pytest.raises(ValueError, match="repeats a shape"):
        textworld_mixture(["w1-o2-q2", "w1-o2-q2"], num_games=2, games_dir=textworld_games_dir)


def test_alfworld_trains_on_some_task_types_and_evaluates_on_all(tmp_path, monkeypatch):
    from trl_multiturn.envs.alfworld import TASK_TYPES

    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "not-downloaded"))
    games = tmp_path / "games"
    train = alfworld_tasks("train", 4, ["pick_and_place_simple", "look_at_obj_in_light"], games_dir=games)
    assert train["task_type"] == ["pick_and_place_simple", "look_at_obj_in_light"] * 2
    held_out = alfworld_tasks("valid_unseen", 6, games_dir=games)  # no types given: all six, one game of each
    assert sorted(held_out["task_type"]) == sorted(TASK_TYPES)
    assert not set(train["game_file"]) & set(held_out["game_file"])


def test_a_recipe_gives_sft_seeds_disjoint_from_the_rl_games(textworld_games_dir):
    from trl_multiturn.commands.script_args import TextWorldScriptArguments

    sft = TextWorldScriptArguments(world_size=1, nb_objects=2, quest_length=2, games_dir=str(textworld_games_dir),
                                   first_train_game=500_000)
    rl = TextWorldScriptArguments(world_size=1, nb_objects=2, quest_length=2, games_dir=str(textworld_games_dir))
    assert sft.tasks("train", 2)["seed"] == [500_000, 500_001]
    assert rl.tasks("train", 2)["seed"] == [0, 1]
    # Held-out games do not move with it.
    assert sft.tasks("test", 1)["seed"] == [SEED_RANGES["test"][0]]


def test_eval_temperature_is_a_setting_and_greedy_stays_the_default(tiny_chatml_model, textworld_games_dir,
                                                                    monkeypatch, capsys):
    import trl_multiturn.commands.eval as eval_command
    from trl_multiturn.commands.cli import main

    seen = []
    real = eval_command.evaluate

    def recording(*args, **kwargs):
        seen.append(kwargs["temperature"])
        return real(*args, **kwargs)

    monkeypatch.setattr(eval_command, "evaluate", recording)
    common = ["eval", "--model_name_or_path", tiny_chatml_model, "--num_eval_games", "1", "--max_turns", "1",
              "--max_completion_length", "4", "--games_dir", str(textworld_games_dir)]
    assert main(common) == 0
    assert main([*common, "--eval_temperature", "0.4"]) == 0
    assert seen == [0.0, 0.4]
    printed = capsys.readouterr().out
    assert "held-out greedy evaluation" in printed and "held-out temperature-0.4 evaluation" in printed


# -- SWE-Gym: difficulty tiers and a held-out split ---------------------------------------------------------------


def test_swegym_tiers_rank_tasks_by_gold_patch_size_then_test_count():
    from trl_multiturn.envs.swegym import task_rows
    from trl_multiturn.envs.swegym.selection import difficulty_tiers, fail_to_pass_count, patch_size

    assert patch_size("--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n-a = 1\n+a = 2\n b = 3\n") == 2
    assert fail_to_pass_count({"FAIL_TO_PASS": '["t::a", "t::b"]'}) == 2  # SWE-bench's JSON text form
    rows = task_rows()
    tiers = difficulty_tiers(rows)
    assert sorted(tiers.values()) == ["easy"] * 4 + ["hard"] * 4 + ["medium"] * 4  # thirds of the 12 tasks
    size = {row["instance_id"]: (patch_size(row["patch"]), fail_to_pass_count(row)) for row in rows}
    for a in rows:  # every easy task's fix is no larger (lines, then tests) than every hard task's
        for b in rows:
            if tiers[a["instance_id"]] == "easy" and tiers[b["instance_id"]] == "hard":
                assert size[a["instance_id"]] <= size[b["instance_id"]]
    assert tiers["trl-multiturn__lrucache-1"] == "easy" and tiers["trl-multiturn__roman-1"] == "hard"


def test_swegym_held_out_tasks_never_train_and_keep_their_side_as_the_set_changes():
    from trl_multiturn.envs.swegym import task_rows
    from trl_multiturn.envs.swegym.selection import held_out_ids, select_tasks

    rows = task_rows()
    held = held_out_ids(rows, 0.5)
    assert len(held) == 6
    train = select_tasks(rows, held_out=False, fraction=0.5)
    evaluated = select_tasks(rows, held_out=True, fraction=0.5)
    assert {r["instance_id"] for r in evaluated} == held and not held & {r["instance_id"] for r in train}
    assert len(train) + len(evaluated) == len(rows)
    # A task's side depends on its id alone: a smaller task set keeps every remaining task on its side.
    assert held_out_ids(rows[:5], 0.5) == held & {r["instance_id"] for r in rows[:5]}
    easy = select_tasks(rows, held_out=False, fraction=0.5, tiers=["easy"], count=1)
    assert len(easy) == 1 and easy[0] in train
    with pytest.raises(ValueError, match="held_out_fraction=1"):
        held_out_ids(rows, 1)
    with pytest.raises(ValueError, match=r"tiers \['trivial'\]"):
        select_tasks(rows, held_out=False, fraction=0.5, tiers=["trivial"])


def test_a_swegym_study_trains_on_its_tiers_and_evaluates_on_held_out_tasks(tmp_path):
    from trl_multiturn.commands.study.spec import load_study

    study = load_study(Path(__file__).resolve().parents[3] / "recipes" / "paper" / "swegym_tiers_cpu.yaml")
    by_name = {run.name: run for run in study.runs}
    everything = by_name["all"].data
    held_out = {row["instance_id"] for row in everything.tasks("eval")}
    trained = {row["instance_id"] for row in everything.tasks("train")}
    assert len(held_out) == len(trained) == 6 and not held_out & trained
    assert {row["instance_id"] for row in everything.tasks("sft")} == trained  # SFT replays the training tasks
    easy = by_name["easy"].data
    assert {row["instance_id"] for row in easy.tasks("train")} < trained
    assert {row["instance_id"] for row in easy.tasks("eval")} == held_out  # every run is evaluated on all tiers
    # The environment each run plays is the SWEGymConfig its data section names.
    assert easy.environment_factory().args[0].reward == "resolved"


def test_the_swegym_reward_study_compares_rewards_from_one_sft_checkpoint():
    from trl_multiturn.commands.study.spec import load_study

    study = load_study(Path(__file__).resolve().parents[3] / "recipes" / "paper" / "swegym_reward_cpu.yaml")
    rewards = [run.data.environment_factory().args[0].reward for run in study.runs]
    assert rewards == ["resolved", "dense"]
    # The reward is not an SFT input (SFT replays gold patches): both runs share one SFT checkpoint ...
    assert len({run.sft_key() for run in study.runs}) == 1
    # ... while any other environment setting is one.
    other = dataclasses.replace(study.runs[0], data=dataclasses.replace(
        study.runs[0].data, swegym={**study.runs[0].data.swegym, "max_observation_chars": 999}))
    assert other.sft_key() != study.runs[0].sft_key()
