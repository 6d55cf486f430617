"""The configuration pieces the paper's studies need: TextWorld shape mixtures, ALFWorld task-type mixtures (train on
some types, evaluate on all), disjoint SFT seeds from a recipe, and the evaluation temperature as a setting."""

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
    from trl_multiturn.envs.textworld.script_args import TextWorldScriptArguments

    sft = TextWorldScriptArguments(world_size=1, nb_objects=2, quest_length=2, games_dir=str(textworld_games_dir),
                                   first_train_game=500_000)
    rl = TextWorldScriptArguments(world_size=1, nb_objects=2, quest_length=2, games_dir=str(textworld_games_dir))
    assert sft.tasks("train", 2)["seed"] == [500_000, 500_001]
    assert rl.tasks("train", 2)["seed"] == [0, 1]
    # Held-out games do not move with it.
    assert sft.tasks("test", 1)["seed"] == [SEED_RANGES["test"][0]]


def test_eval_temperature_is_a_setting_and_greedy_stays_the_default(tiny_chatml_model, textworld_games_dir,
                                                                    monkeypatch, capsys):
    import trl_multiturn.evaluation as evaluation
    from trl_multiturn.cli import main

    seen = []
    real = evaluation.evaluate

    def recording(*args, **kwargs):
        seen.append(kwargs["temperature"])
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluation, "evaluate", recording)
    common = ["eval", "--model_name_or_path", tiny_chatml_model, "--num_eval_games", "1", "--max_turns", "1",
              "--max_completion_length", "4", "--games_dir", str(textworld_games_dir)]
    assert main(common) == 0
    assert main([*common, "--eval_temperature", "0.4"]) == 0
    assert seen == [0.0, 0.4]
    printed = capsys.readouterr().out
    assert "held-out greedy evaluation" in printed and "held-out temperature-0.4 evaluation" in printed
