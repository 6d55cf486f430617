"""Every recipe parses with its example's own TrlParser, and the README's main job runs end to end."""

import inspect
import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from trl import TrlParser

ROOT = Path(__file__).resolve().parents[1]
PAIRS = [
    ("textworld_grpo", "quickstart"),
    ("textworld_sft", "quickstart_sft"),
    ("textworld_grpo", "textworld_w2-o3-q4_grpo"),
    ("textworld_rloo", "textworld_rloo"),
    ("textworld_ppo", "textworld_ppo"),
    ("textworld_sft", "textworld_sft"),
    ("textworld_dagger", "quickstart_dagger"),
    ("alfworld_grpo", "alfworld_grpo"),
    ("alfworld_grpo", "alfworld_gigpo_stepwise"),
    ("alfworld_grpo", "alfworld_gigpo_stepwise_cpu"),
    ("swegym_grpo", "swegym_grpo"),
]


def test_every_recipe_has_an_example():
    recipes = {p.stem for p in (ROOT / "recipes").glob("*.yaml")}
    assert recipes == {recipe for _, recipe in PAIRS}


@pytest.mark.parametrize("example,recipe", PAIRS)
def test_recipe_parses_with_its_example(example, recipe, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # output folders a config may create stay out of the repo
    module = runpy.run_path(str(ROOT / "examples" / f"{example}.py"), run_name="example")
    classes = [p.annotation for p in inspect.signature(module["main"]).parameters.values()]
    # --use_cpu: paper-scale recipes ask for bf16, which TrainingArguments refuses on a CPU-only machine.
    argv = ["--config", str(ROOT / "recipes" / f"{recipe}.yaml"), "--use_cpu", "true"]
    parsed = TrlParser(tuple(classes)).parse_args_and_config(argv)
    assert [type(x) for x in parsed[: len(classes)]] == classes


def test_the_main_job_trains_and_reports_held_out_success(tiny_chatml_model, tmp_path, textworld_games_dir):
    """The README's first command, with the tiny model in place of the offline default (which is slow on CPU)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1")
    cmd = [sys.executable, str(ROOT / "examples" / "textworld_grpo.py"),
           "--config", str(ROOT / "recipes/quickstart.yaml"), "--model_name_or_path", tiny_chatml_model,
           "--output_dir", str(tmp_path / "out"), "--max_steps", "1",
           "--num_train_games", "2", "--num_eval_games", "2", "--games_dir", str(textworld_games_dir)]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "held-out greedy evaluation on 2 test games: success" in done.stdout
    assert "starting model, held-out greedy evaluation on 2 test games: success" in done.stdout
    assert "held-out success, the same games:" in done.stdout and "exact McNemar p" in done.stdout
    out = tmp_path / "out"
    assert (out / "config.json").exists()
    # What the run leaves for `trl-multiturn eval`, `plot` and the Hub.
    assert json.loads((out / "episode_settings.json").read_text())["max_turns"] == 4
    assert json.loads((out / "eval_results.json").read_text())["summary"]["n"] == 2
    assert len(json.loads((out / "trainer_state.json").read_text())["log_history"]) >= 1
    card = (out / "README.md").read_text()
    assert "recipes/quickstart.yaml" in card and "## Evaluation" in card


def test_an_interrupted_run_resumes_at_its_step_with_its_learning_rate_and_checkpoints(
        tiny_chatml_model, tmp_path, textworld_games_dir):
    """`--resume_from_checkpoint latest` continues the run where its last checkpoint left it: a 4-step run is cut back
    to its checkpoint-2 (as if killed after it), resumed, and ends at step 4 with the uninterrupted run's learning
    rates for steps 3 and 4 and checkpoint-1 and -2 untouched. Ignoring the flag restarts at step 1 with a fresh
    schedule and overwrites them."""
    import shutil

    env = dict(os.environ, HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1")
    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "examples" / "textworld_grpo.py"),
           "--config", str(ROOT / "recipes/quickstart.yaml"), "--model_name_or_path", tiny_chatml_model,
           "--output_dir", str(out), "--max_steps", "4", "--save_strategy", "steps", "--save_steps", "1",
           "--lr_scheduler_type", "linear", "--eval_start_model", "false", "--num_train_games", "2",
           "--num_eval_games", "1", "--games_dir", str(textworld_games_dir)]

    def run(*extra):
        done = subprocess.run([*cmd, *extra], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]

    def learning_rates(state_file):
        return {e["step"]: e["learning_rate"] for e in json.loads(state_file.read_text())["log_history"]
                if "learning_rate" in e}

    run()
    uninterrupted = learning_rates(out / "trainer_state.json")
    assert sorted(uninterrupted) == [1, 2, 3, 4] and uninterrupted[3] != uninterrupted[1]
    for name in ("checkpoint-3", "checkpoint-4"):
        shutil.rmtree(out / name)
    (out / "trainer_state.json").unlink()
    kept = {name: (out / name / "trainer_state.json").stat().st_mtime_ns for name in ("checkpoint-1", "checkpoint-2")}
    run("--resume_from_checkpoint", "latest")
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    assert learning_rates(out / "checkpoint-4" / "trainer_state.json") == uninterrupted
    assert {name: (out / name / "trainer_state.json").stat().st_mtime_ns for name in kept} == kept
    with pytest.raises(AssertionError, match="holds no checkpoint-N"):
        cmd[cmd.index("--output_dir") + 1] = str(tmp_path / "empty")
        run("--resume_from_checkpoint", "latest")


def test_cli_eval_reports_greedy_success(tiny_chatml_model, textworld_games_dir, capsys, tmp_path):
    from trl_multiturn.commands.cli import main

    code = main(["eval", "--model_name_or_path", tiny_chatml_model, "--num_eval_games", "2", "--max_turns", "2",
                 "--max_completion_length", "4", "--games_dir", str(textworld_games_dir),
                 "--results_dir", str(tmp_path)])
    assert code == 0
    printed = capsys.readouterr().out
    assert re.search(r"held-out greedy evaluation on 2 test games: success [0-2]/2 = .*95% CI", printed)


def test_cli_refuses_unknown_options_outside_train_and_eval(tmp_path):
    from trl_multiturn.commands.cli import main

    with pytest.raises(SystemExit):
        main(["make-games", "--env", "textworld", "--out", str(tmp_path), "--seeds", "0", "--world-size", "1",
              "--nb-objects", "1", "--quest-length", "1", "--bogus"])
