"""Every recipe parses with its example's own TrlParser, and the README's main job runs end to end."""

import inspect
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
    ("alfworld_grpo", "alfworld_grpo"),
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
    assert (tmp_path / "out" / "config.json").exists()


def test_cli_eval_reports_greedy_success(tiny_chatml_model, textworld_games_dir, capsys):
    from trl_multiturn.cli import main

    code = main(["eval", "--model_name_or_path", tiny_chatml_model, "--num_eval_games", "2", "--max_turns", "2",
                 "--max_completion_length", "4", "--games_dir", str(textworld_games_dir)])
    assert code == 0
    printed = capsys.readouterr().out
    assert re.search(r"held-out greedy evaluation on 2 test games: success [0-2]/2 = .*95% CI", printed)


def test_cli_refuses_unknown_options_outside_train_and_eval(tmp_path):
    from trl_multiturn.cli import main

    with pytest.raises(SystemExit):
        main(["make-games", "--env", "textworld", "--out", str(tmp_path), "--seeds", "0", "--world-size", "1",
              "--nb-objects", "1", "--quest-length", "1", "--bogus"])
