"""The environment registry (`trl_multiturn.envs.suites`): `trl-multiturn eval` and a study pick the same held-out
tasks of every registered suite, never a training task, and an environment registered once is played by both
commands."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import yaml
from datasets import Dataset
from toy_envs import CountingEnv

from trl_multiturn.commands.cli import eval_parser, main
from trl_multiturn.commands.env_tasks import suite_tasks
from trl_multiturn.commands.study.spec import StudyData, load_study
from trl_multiturn.envs.suites import SUITES, Suite, register_suite, suite_of_class
from trl_multiturn.episode_settings import environment_spec


def counting_tasks(data, part):
    """Toy suite: a task is a turn target; training targets count up from 1, held-out ones from 1001."""
    first = {"train": 1, "sft": 501, "eval": 1001}[part]
    return Dataset.from_list([{"target": first + k} for k in range(data.count(part))])


register_suite(Suite("counting", f"{CountingEnv.__module__}:CountingEnv", counting_tasks,
                     held_out="targets from 1001 on", task_key="target"))


def _eval_held_out(env, argv, settings=None):
    """The held-out tasks `trl-multiturn eval --env ENV ARGV` plays (its own argument parsing and task rule)."""
    script_args, eval_args = eval_parser().parse_args_and_config(["--env", env, *argv])
    return suite_tasks(env, "eval", script_args, eval_args, settings or {})


def _study_tasks(data: StudyData) -> dict:
    data.check()
    return {part: data.tasks(part) for part in ("train", "sft", "eval") if data.count(part) != 0}


def _held_out_cases(tmp_path, textworld_games_dir):
    """(suite, the study's data, the same held-out games asked of `trl-multiturn eval`) for every registered
    suite, each with its defaults where both commands have one."""
    alfworld_games = str(tmp_path / "alfworld")
    return {
        "textworld": (StudyData(train_shapes=["w1-o2-q2"], num_train_games=2, num_eval_games=2, num_sft_games=1,
                                sft_first_game=2, games_dir=str(textworld_games_dir)),
                      ["--world_size", "1", "--nb_objects", "2", "--quest_length", "2", "--num_eval_games", "2",
                       "--games_dir", str(textworld_games_dir)]),
        # Three held-out games of two types: the study's rule takes 2 + 1 (equal parts); a shuffle of the games
        # the folder holds would not.
        "alfworld": (StudyData(env="alfworld", task_types=["pick_and_place_simple"],
                               eval_task_types=["pick_and_place_simple", "look_at_obj_in_light"], num_train_games=1,
                               num_eval_games=3, num_sft_games=0, games_dir=alfworld_games),
                     ["--task_types", "pick_and_place_simple", "look_at_obj_in_light", "--num_eval_games", "3",
                      "--alfworld_games_dir", alfworld_games]),
        "swegym": (StudyData(env="swegym", num_train_games=None, num_eval_games=None, num_sft_games=2),
                   ["--num_eval_games", "12"]),
        "counting": (StudyData(env="counting", num_train_games=3, num_eval_games=3, num_sft_games=2),
                     ["--num_eval_games", "3"]),
    }


def test_every_suite_is_covered():
    assert set(SUITES) >= {"textworld", "alfworld", "swegym", "counting"}


@pytest.mark.filterwarnings("ignore::jericho.UnsupportedGameWarning")
def test_eval_and_study_hold_out_the_same_tasks_disjoint_from_training(tmp_path, monkeypatch, textworld_games_dir):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "not-downloaded"))
    cases = _held_out_cases(tmp_path, textworld_games_dir)
    assert set(cases) == set(SUITES), "a registered suite has no held-out case here"
    for name, (data, argv) in cases.items():
        suite = SUITES[name]
        if name == "alfworld":
            # A folder that already holds more held-out games (an earlier, larger evaluation) changes nothing.
            _eval_held_out(name, ["--task_types", "pick_and_place_simple", "look_at_obj_in_light",
                                  "--num_eval_games", "6", "--alfworld_games_dir", data.games_dir])
        study = _study_tasks(data)
        played = _eval_held_out(name, argv)
        keys = {part: [suite.key(task) for task in tasks] for part, tasks in study.items()}
        assert [suite.key(task) for task in played] == keys["eval"], name
        assert keys["eval"] and len(set(keys["eval"])) == len(keys["eval"]), name
        for part in ("train", "sft"):
            if part in keys:
                assert keys[part] and not set(keys[part]) & set(keys["eval"]), (name, part)
    swegym_eval = set(_eval_held_out("swegym", ["--num_eval_games", "3"])["instance_id"])
    swegym_train = set(StudyData(env="swegym", num_train_games=None).tasks("train")["instance_id"])
    assert len(swegym_eval) == 3 and not swegym_eval & swegym_train


def test_a_registered_environment_is_named_in_saved_settings_and_refused_twice():
    import functools

    assert suite_of_class(CountingEnv) == "counting"
    assert environment_spec(functools.partial(CountingEnv))["name"] == "counting"
    with pytest.raises(ValueError, match="already registered"):
        register_suite(Suite("counting", "json:dumps", counting_tasks, held_out="none"))
    with pytest.raises(ValueError, match="registered environments"):
        SUITES.lookup("no-such-env")


def test_a_registered_environment_gets_eval_and_study(tiny_chatml_model, tmp_path):
    results = tmp_path / "eval"
    assert main(["eval", "--env", "counting", "--model_name_or_path", tiny_chatml_model, "--num_eval_games", "2",
                 "--max_turns", "1", "--max_completion_length", "2", "--results_dir", str(results),
                 "--no_progress"]) == 0
    [saved] = results.glob("eval_results_counting_*.json")
    record = json.loads(saved.read_text())
    assert record["summary"]["n"] == 2 and [o["task"]["target"] for o in record["outcomes"]] == [1001, 1002]

    spec = {"name": "counting", "output_dir": str(tmp_path / "out"), "results": str(tmp_path / "results" / "c"),
            "model": tiny_chatml_model, "data": {"env": "counting", "num_train_games": 2, "num_eval_games": 2},
            "algorithm": "grpo",
            "rl": {"max_turns": 1, "max_completion_length": 2, "num_generations": 2, "per_device_train_batch_size": 2,
                   "max_steps": 1, "use_cpu": True, "bf16": False, "report_to": "none", "save_strategy": "no"},
            "eval": {"start": False}, "runs": [{"name": "one"}]}
    path = tmp_path / "counting.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert load_study(path).runs[0].data.tasks("eval")["target"] == [1001, 1002]
    assert main(["study", str(path)]) == 0
    run = json.loads((tmp_path / "results" / "c.json").read_text())["runs"]["one"]
    assert run["rl"]["steps"] == 1 and sorted(run["eval"]["outcomes"]) == ["1001", "1002"]


def test_a_registered_environment_trains_from_the_command_line_and_eval_plays_it_after(tiny_chatml_model, tmp_path,
                                                                                        capsys):
    """`trl-multiturn train rloo --env counting`: the suite's training targets, its held-out ones at the end, and
    episode_settings.json naming the suite, so `eval` without --env plays counting rather than TextWorld."""
    out = tmp_path / "rloo"
    assert main(["train", "rloo", "--env", "counting", "--model_name_or_path", tiny_chatml_model, "--output_dir",
                 str(out), "--num_train_games", "2", "--num_eval_games", "2", "--max_turns", "1",
                 "--max_completion_length", "2", "--num_generations", "2", "--per_device_train_batch_size", "2",
                 "--max_steps", "1", "--use_cpu", "true", "--bf16", "false", "--report_to", "none",
                 "--save_strategy", "no", "--disable_tqdm", "true"]) == 0
    saved = json.loads((out / "episode_settings.json").read_text())
    assert saved["environment"]["name"] == "counting" and saved["tasks"]["num_tasks"] == 2
    state = json.loads((out / "eval_results.json").read_text())
    assert [o["task"]["target"] for o in state["outcomes"]] == [1001, 1002]
    assert main(["eval", "--model_name_or_path", str(out), "--num_eval_games", "2", "--no_progress"]) == 0
    assert "on 2 held-out counting tasks (targets from 1001 on)" in capsys.readouterr().out
    [record] = out.glob("eval_results_counting_*.json")
    assert [o["task"]["target"] for o in json.loads(record.read_text())["outcomes"]] == [1001, 1002]


def test_an_installed_packages_suite_is_known_to_the_command_line_in_a_fresh_process(tiny_chatml_model, tmp_path):
    """A package that declares its suite in the `trl_multiturn.suites` entry-point group is played by
    `trl-multiturn eval --env NAME` from a shell, with no register_suite call of the user's own."""
    plugin = tmp_path / "site"
    (plugin / "toy_suite_plugin-0.1.dist-info").mkdir(parents=True)
    (plugin / "toy_suite_plugin-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: toy-suite-plugin\nVersion: 0.1\n")
    (plugin / "toy_suite_plugin-0.1.dist-info" / "entry_points.txt").write_text(
        "[trl_multiturn.suites]\nplugged = toy_suite_plugin:SUITE\n")
    (plugin / "toy_suite_plugin.py").write_text(textwrap.dedent("""\
        from datasets import Dataset
        from trl_multiturn.envs.suites import Suite

        def tasks(data, part):
            return Dataset.from_list([{"target": 2001 + k} for k in range(data.count(part))])

        SUITE = Suite("plugged", "toy_envs:CountingEnv", tasks, held_out="targets from 2001 on", task_key="target")
        """))
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: toy_envs
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin), tests_dir, os.environ.get("PYTHONPATH", "")])}
    argv = ["eval", "--env", "plugged", "--model_name_or_path", tiny_chatml_model, "--num_eval_games", "1",
            "--max_turns", "1", "--max_completion_length", "2", "--results_dir", str(tmp_path / "out"),
            "--no_progress"]
    code = "import sys; from trl_multiturn.commands.cli import main; sys.exit(main(sys.argv[1:]))"
    played = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True)
    assert played.returncode == 0, played.stderr[-2000:]
    assert "held-out plugged tasks (targets from 2001 on)" in played.stdout
    (plugin / "toy_suite_plugin-0.1.dist-info" / "entry_points.txt").write_text("")
    unknown = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True)
    assert unknown.returncode == 2 and "env='plugged'" in unknown.stderr
