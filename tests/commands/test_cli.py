"""`trl-multiturn`: every command's help lists its fields; `eval` takes a training recipe and the settings a model was
trained with, for TextWorld, ALFWorld and SWE-Gym."""

import functools
import json
from pathlib import Path

import pytest

from trl_multiturn.commands.cli import main
from trl_multiturn.commands.train import TRAINERS

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.filterwarnings("ignore::jericho.UnsupportedGameWarning")


def _help(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_top_level_help_lists_the_commands(capsys):
    text = _help([], capsys)
    assert all(command in text for command in ("make-games", "train", "eval", "plot"))
    assert "95% confidence interval" in " ".join(text.split())  # a literal % in a help string is written %%


@pytest.mark.parametrize("algo", sorted(TRAINERS))
def test_train_help_lists_the_script_and_trainer_fields(algo, capsys):
    text = _help(["train", algo], capsys)
    assert text.startswith(f"usage: trl-multiturn train {algo}")
    for option in ("--world_size", "--num_eval_games", "--learning_rate", "--output_dir", "--system_prompt"):
        assert option in text
    if algo not in ("sft", "dagger"):
        assert "--max_turns" in text and "--reward_mode" in text and "The most replies the model makes" in text


def test_train_and_eval_help_list_their_choices_and_fields(capsys):
    assert all(algo in _help(["train"], capsys) for algo in TRAINERS)
    text = _help(["eval"], capsys)
    for option in ("--env", "--max_turns", "--system_prompt", "--action_parser", "--results_dir", "--eval_split",
                   "--dataset_name", "--model_name_or_path"):
        assert option in text
    assert "--output" in _help(["plot"], capsys)


def _eval_record(folder: Path) -> dict:
    """The one `trl-multiturn eval` result in `folder`."""
    (path,) = folder.glob("eval_results_*.json")
    return json.loads(path.read_text())


def test_eval_takes_a_training_recipe(tiny_chatml_model, textworld_games_dir, tmp_path, capsys):
    """The quickstart recipe's episode fields are used, its training-only fields ignored with a note."""
    code = main(["eval", "--config", str(ROOT / "recipes" / "quickstart.yaml"), "--model_name_or_path",
                 tiny_chatml_model, "--num_eval_games", "1", "--games_dir", str(textworld_games_dir),
                 "--max_turns", "1", "--results_dir", str(tmp_path), "--no_progress"])
    assert code == 0
    printed = capsys.readouterr().out
    note = next(line for line in printed.splitlines() if line.startswith("note: ignoring"))
    assert "num_generations" in note and "learning_rate" in note and "system_prompt" not in note
    record = _eval_record(tmp_path)
    recipe = (ROOT / "recipes" / "quickstart.yaml").read_text()
    assert record["settings"]["system_prompt"] in recipe and record["settings"]["system_prompt"].startswith("You")
    assert record["settings"]["max_turns"] == 1  # the command line wins over the recipe's 4
    assert record["settings"]["temperature"] == 0.0  # greedy: the recipe's sampling temperature is training's
    assert record["settings"]["max_completion_length"] == 12 and record["settings"]["max_episode_tokens"] == 1024
    assert record["outcomes"][0]["task"]["quest_length"] == 2 and record["summary"]["n"] == 1


def test_eval_evaluates_the_model_the_recipe_trained(tiny_chatml_model, tmp_path):
    from trl_multiturn.commands.eval import config_model_dir

    assert config_model_dir(["--output_dir", tiny_chatml_model], []) == tiny_chatml_model
    assert config_model_dir(["--output_dir", tiny_chatml_model], ["--model_name_or_path", "x"]) is None
    with pytest.raises(FileNotFoundError, match="the model it trains is not there"):  # nothing saved there
        config_model_dir(["--output_dir", str(tmp_path)], ["--config", "quickstart.yaml"])


def test_an_input_error_is_one_line_naming_the_flag_and_debug_shows_the_traceback(tmp_path, capsys):
    missing = str(tmp_path / "no_model")
    assert main(["eval", "--model_name_or_path", missing, "--num_eval_games", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("trl-multiturn eval: error: --model_name_or_path") and missing in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    with pytest.raises(FileNotFoundError, match="no such folder"):
        main(["eval", "--model_name_or_path", missing, "--num_eval_games", "1", "--debug"])


def test_version_names_the_package_and_what_it_runs_on(capsys):
    from trl_multiturn import __version__

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"trl-multiturn {__version__} (trl 1.") and "transformers" in printed


def test_eval_refuses_unknown_command_line_options(tiny_chatml_model):
    with pytest.raises(SystemExit):
        main(["eval", "--model_name_or_path", tiny_chatml_model, "--bogus", "1"])


@pytest.mark.parametrize("env", ["alfworld", "swegym"])
def test_environment_settings_round_trip_through_the_saved_spec(env):
    """What a trainer saves of `partial(Env, Config(...))` rebuilds the same environment for evaluation."""
    from trl_multiturn.episode_settings import environment_factory_from_spec, environment_spec

    if env == "alfworld":
        from trl_multiturn.envs.alfworld import ALFWorldConfig as Config
        from trl_multiturn.envs.alfworld import ALFWorldEnv as Env
        changed = {"admissible_commands": True, "expert_max_steps": 50}
    else:
        from trl_multiturn.envs.swegym import SWEGymConfig as Config
        from trl_multiturn.envs.swegym import SWEGymEnv as Env
        changed = {"max_observation_chars": 1000, "reward": "dense"}
    spec = json.loads(json.dumps(environment_spec(functools.partial(Env, Config(**changed)))))
    assert spec["name"] == env
    rebuilt = environment_factory_from_spec(spec)()
    assert isinstance(rebuilt, Env) and rebuilt.config == Config(**changed)
    overridden = environment_factory_from_spec(spec, env, **{next(iter(changed)): Config().__dict__[
        next(iter(changed))]})()
    assert overridden.config != Config(**changed)
    with pytest.raises(ValueError, match="not an Environment"):
        environment_factory_from_spec({"class": "json:dumps"})


def test_eval_plays_alfworld_games_it_generates(tiny_chatml_model, tmp_path):
    code = main(["eval", "--env", "alfworld", "--model_name_or_path", tiny_chatml_model, "--num_eval_games", "1",
                 "--task_types", "pick_and_place_simple", "--alfworld_games_dir", str(tmp_path / "games"),
                 "--max_turns", "1", "--max_completion_length", "4", "--results_dir", str(tmp_path),
                 "--no_progress"])
    assert code == 0
    record = _eval_record(tmp_path)
    assert record["env"] == "alfworld" and record["summary"]["n"] == 1
    assert record["summary"]["by_task_type"]["pick_and_place_simple"]["n"] == 1
    assert "/valid_unseen/pick_and_place_simple" in record["outcomes"][0]["task"]["game_file"]


def test_eval_picks_swegym_tasks():
    from trl_multiturn.commands.env_tasks import suite_tasks
    from trl_multiturn.commands.eval import EvalArguments
    from trl_multiturn.commands.script_args import TextWorldScriptArguments

    tasks = suite_tasks("swegym", "eval", TextWorldScriptArguments(num_eval_games=3), EvalArguments(), {})
    assert len(tasks) == 3 and {"instance_id", "FAIL_TO_PASS", "repo"} <= set(tasks.column_names)


def test_train_then_eval_from_the_command_line_plays_as_trained(tiny_chatml_model, textworld_games_dir, tmp_path,
                                                                capsys):
    """`train sft` with a recipe saves its episode settings; `eval` of the saved folder plays with them."""
    out = tmp_path / "sft"
    assert main(["train", "sft", "--config", str(ROOT / "recipes" / "quickstart_sft.yaml"), "--model_name_or_path",
                 tiny_chatml_model, "--output_dir", str(out), "--max_steps", "1", "--num_train_games", "2",
                 "--games_dir", str(textworld_games_dir), "--disable_tqdm", "true"]) == 0
    assert f"MultiTurnSFTTrainer: saved the model, its episode settings and card in {out}" in capsys.readouterr().out
    saved = json.loads((out / "episode_settings.json").read_text())
    assert saved["system_prompt"].startswith("You are playing") and saved["action_parser"] == "first_line"
    assert saved["environment"]["name"] == "textworld"
    assert "trained with multi-turn SFT" in (out / "README.md").read_text()
    assert "## Evaluation" not in (out / "README.md").read_text()  # the recipe evaluates nothing
    assert saved["tasks"] == {"num_tasks": 2, "shapes": [{"world_size": 1, "nb_objects": 2, "quest_length": 2}]}
    # No shape given: the training games' shape (w1-o2-q2), not the default w2-o3-q4.
    assert main(["eval", "--model_name_or_path", str(out), "--num_eval_games", "1", "--max_turns", "2",
                 "--no_progress"]) == 0
    assert "note: playing w1-o2-q2 games, the shape the model was trained on" in capsys.readouterr().out
    record = _eval_record(out)  # beside the model
    assert record["settings"]["system_prompt"] == saved["system_prompt"] and record["settings"]["max_turns"] == 2
    assert record["settings"]["environment"]["settings"]["games_dir"] == str(textworld_games_dir)
    assert record["outcomes"][0]["task"]["game_file"].startswith(str(textworld_games_dir))
    assert record["outcomes"][0]["task"]["world_size"] == 1 and record["outcomes"][0]["task"]["nb_objects"] == 2
    # A shape that differs from training is played as asked and said; the first result is kept beside the second.
    assert main(["eval", "--model_name_or_path", str(out), "--num_eval_games", "1", "--world_size", "2",
                 "--nb_objects", "3", "--quest_length", "4", "--max_turns", "2", "--no_progress"]) == 0
    assert "the model was trained on w1-o2-q2" in capsys.readouterr().out
    results = sorted(out.glob("eval_results_*.json"))
    assert len(results) == 2 and {json.loads(p.read_text())["outcomes"][0]["task"]["world_size"]
                                  for p in results} == {1, 2}
    card = (out / "README.md").read_text()  # the card lists both evaluations, each with its file
    assert card.count("## Evaluation\n") == 1 and card.count("## Evaluate it") == 1 and card.count("| all | ") == 2
    assert "Held-out tasks (textworld, test, w1-o2-q2, 1 tasks), played greedily with at most 2 turns" in card
    assert "(textworld, test, w2-o3-q4, 1 tasks)" in card and all(f"`{p.name}`" in card for p in results)


TINY_GRPO = ["--max_turns", "1", "--max_completion_length", "4", "--num_generations", "2",
             "--per_device_train_batch_size", "2", "--max_steps", "1", "--use_cpu", "true", "--bf16", "false",
             "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true"]
"""A one-step CPU run of `trl-multiturn train grpo|rloo` with one-turn episodes."""


def test_train_on_alfworld_from_the_command_line_then_eval_plays_alfworld(tiny_chatml_model, tmp_path, capsys):
    """`train grpo --env alfworld` trains on generated ALFWorld training games, evaluates on held-out
    (valid_unseen) ones, and saves the environment and task types, so `eval` without --env or --task_types plays
    the same held-out game again."""
    out, games = tmp_path / "grpo", str(tmp_path / "games")
    assert main(["train", "grpo", "--env", "alfworld", "--model_name_or_path", tiny_chatml_model, "--output_dir",
                 str(out), "--task_types", "pick_and_place_simple", "--alfworld_games_dir", games,
                 "--num_train_games", "2", "--num_eval_games", "1", *TINY_GRPO]) == 0
    saved = json.loads((out / "episode_settings.json").read_text())
    assert saved["environment"]["name"] == "alfworld" and saved["environment"]["class"].endswith(":ALFWorldEnv")
    assert saved["tasks"] == {"num_tasks": 2, "shapes": [{"task_type": "pick_and_place_simple"}]}
    held_out = json.loads((out / "eval_results.json").read_text())
    assert held_out["summary"]["n"] == 1 and "/valid_unseen/" in held_out["outcomes"][0]["task"]["game_file"]
    capsys.readouterr()
    assert main(["eval", "--model_name_or_path", str(out), "--num_eval_games", "1", "--alfworld_games_dir", games,
                 "--no_progress"]) == 0
    printed = capsys.readouterr().out
    assert "held-out alfworld tasks" in printed
    assert "note: playing pick_and_place_simple games, the task types the model was trained on" in printed
    record = _eval_record(out)
    assert record["env"] == "alfworld"
    assert record["outcomes"][0]["task"]["game_file"] == held_out["outcomes"][0]["task"]["game_file"]


def test_train_refuses_an_unknown_environment_naming_the_flag(capsys):
    assert main(["train", "grpo", "--env", "alfwrld"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "env='alfwrld': registered environments:" in error
    assert "did you mean 'alfworld'?" in error


def test_train_on_swegym_takes_the_suite_factory_and_its_training_side(tiny_chatml_model, tmp_path, monkeypatch):
    """`--env swegym` without playing (a trainer stand-in records what it is given): SWEGymEnv with the given
    settings, on tasks of the training side of the hash split only."""
    import trl_multiturn.commands.cli as cli
    from trl_multiturn.commands.env_tasks import suite_tasks
    from trl_multiturn.commands.eval import EvalArguments
    from trl_multiturn.commands.script_args import TextWorldScriptArguments
    from trl_multiturn.envs.swegym import SWEGymConfig, SWEGymEnv

    given = {}

    class Stop(Exception):
        pass

    def trainer(**kwargs):
        given.update(kwargs)
        raise Stop

    monkeypatch.setattr(cli, "trainer_class", lambda algo: trainer)
    with pytest.raises(Stop):
        main(["train", "grpo", "--env", "swegym", "--model_name_or_path", tiny_chatml_model, "--output_dir",
              str(tmp_path), "--num_train_games", "3", "--env_settings", '{"reward": "dense"}', *TINY_GRPO])
    factory = given["environment_factory"]
    assert factory.func is SWEGymEnv and factory.args == (SWEGymConfig(reward="dense"),)
    held_out = suite_tasks("swegym", "eval", TextWorldScriptArguments(num_eval_games=100), EvalArguments(), {})
    trained = set(given["train_dataset"]["instance_id"])
    assert len(trained) == 3 and not trained & set(held_out["instance_id"])


def test_eval_refuses_a_model_trained_on_an_environment_it_cannot_build(tiny_chatml_model, tmp_path):
    """A user's own environment is not replaced by TextWorld: refused, unless --env says which to play (noted)."""
    import shutil

    model = shutil.copytree(tiny_chatml_model, tmp_path / "model")
    (model / "episode_settings.json").write_text(json.dumps(
        {"max_turns": 2, "environment": {"name": "MazeEnv", "class": "my_envs.maze:MazeEnv", "settings": {}}}))
    with pytest.raises(ValueError, match=r"trained on 'my_envs.maze:MazeEnv'.*give --env"):
        main(["eval", "--model_name_or_path", str(model), "--num_eval_games", "1", "--debug"])
    assert main(["eval", "--model_name_or_path", str(model), "--num_eval_games", "1"]) == 2  # one error line


@pytest.mark.parametrize("recipe", sorted(p.name for p in (ROOT / "recipes").glob("*.yaml")))
def test_every_recipe_is_accepted_by_eval(recipe):
    from trl_multiturn.commands.cli import eval_parser

    script_args, eval_args, config_only, cli_only = eval_parser().parse_args_and_config(
        ["--config", str(ROOT / "recipes" / recipe)], return_remaining_strings=True, separate_remaining_strings=True)
    assert cli_only == [] and "--model_name_or_path" not in config_only
    assert "--max_turns" not in config_only and "--system_prompt" not in config_only
    assert script_args.eval_temperature == 0.0  # a recipe's `temperature` is training's sampling, not evaluation's


def test_settings_of_a_hub_model_out_of_reach_are_none(monkeypatch):
    from trl_multiturn.episode_settings import load_episode_settings

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert load_episode_settings("someone/not-cached") == {} and load_episode_settings("not/a/repo") == {}
