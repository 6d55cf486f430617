"""`trl-multiturn eval` writes into a folder of its own, refuses what it cannot evaluate with one line, and plays a
user's environment registered as a suite through an entry point by the card's own command."""

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from trl_multiturn.commands.cli import main

ROOT = Path(__file__).resolve().parents[2]

SUMS_PACKAGE = '''
"""A user's environment: add two one-digit numbers."""
from trl_multiturn import Environment, StepResult
from trl_multiturn.envs import TaskError
from trl_multiturn.envs.suites import Suite


class SumsEnv(Environment):
    def reset(self, task):
        if "a" not in task or "b" not in task:
            raise TaskError(f"task {task!r} has no 'a' or 'b' column: give both numbers to add")
        self.answer = str(task["a"] + task["b"])
        return f"What is {task['a']} + {task['b']}? Reply with the number."

    def step(self, action):
        won = action.strip() == self.answer
        return StepResult("Right." if won else "Wrong.", reward=float(won), done=True, won=won)


def sums_tasks(selection, part):
    first = 0 if part == "train" else 5
    return [{"task_id": f"{part}-{i}", "a": i % 10, "b": (i * 7) % 10}
            for i in range(first, first + selection.count(part))]


def broken_tasks(selection, part):
    return [{"task_id": f"{part}-{i}", "a": i} for i in range(selection.count(part))]  # no 'b'


SUMS = Suite("sums", "sums_env:SumsEnv", tasks=sums_tasks, held_out="sums of the numbers from 5 on")
BROKEN = Suite("sums_broken", "sums_env:SumsEnv", tasks=broken_tasks, held_out="rows without 'b'")
'''

TRAIN = '''
import sys
from datasets import Dataset
from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
from sums_env import SumsEnv

args = MultiTurnGRPOConfig(output_dir="sums_model", max_steps=1, max_turns=1, max_completion_length=2,
                           num_generations=2, per_device_train_batch_size=2, use_cpu=True, report_to="none",
                           env_mode="inline", save_strategy="no", logging_steps=1, disable_tqdm=True)
trainer = MultiTurnGRPOTrainer(model=sys.argv[1], args=args, environment_factory=SumsEnv,
                               train_dataset=Dataset.from_list([{"a": 1, "b": 2}] * 2))
trainer.train()
trainer.save_model("sums_model")
'''


@pytest.fixture
def sums_package(tmp_path):
    """`sums_env` installed as a package declares it would: its module and a dist-info whose entry points name its
    suites in the `trl_multiturn.suites` group (read by a fresh process's `load_installed_suites`)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sums_env.py").write_text(SUMS_PACKAGE)
    info = site / "sums_env-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sums-env\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[trl_multiturn.suites]\nsums = sums_env:SUMS\nsums_broken = sums_env:BROKEN\n")
    return site


def _run(argv, cwd, site):
    env = {"PYTHONPATH": f"{site}:{ROOT}", "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
           "HOME": str(cwd)}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_cards_command_evaluates_a_custom_environment_as_written(sums_package, tiny_chatml_model, tmp_path):
    """Trained in Python on the class (no suite registered in that process), the model's card tells how to evaluate
    it; run as written, the command finds the `sums` suite by the class's import path, plays its held-out tasks
    (called tasks, not test games) without saying the environment differs, and writes into the model's folder."""
    work = tmp_path / "work"
    work.mkdir()
    trained = _run([sys.executable, "-c", TRAIN, tiny_chatml_model], work, sums_package)
    assert trained.returncode == 0, trained.stderr[-3000:]
    card = (work / "sums_model" / "README.md").read_text()
    command = card.split("## Evaluate it")[1].split("```bash\n")[1].split("\n```")[0]
    argv = shlex.split(command)
    assert argv[:2] == ["trl-multiturn", "eval"]
    done = _run([sys.executable, "-m", "trl_multiturn.commands.cli", *argv[1:]], work, sums_package)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "differs" not in done.stdout and "test games" not in done.stdout
    assert "held-out greedy evaluation on 50 tasks: success" in done.stdout, done.stdout
    (results,) = (work / "sums_model").glob("eval_results_sums_*.json")
    assert json.loads(results.read_text())["summary"]["n"] == 50


def test_an_evaluation_whose_every_task_fails_is_one_error_naming_the_field(sums_package, tiny_chatml_model,
                                                                            tmp_path):
    """Rows missing a column fail every episode: the reason (the environment's TaskError, naming the column and
    the fix) on one line and a non-zero exit, not `success 0/0 = nan%`; nothing is written."""
    done = _run([sys.executable, "-m", "trl_multiturn.commands.cli", "eval", "--env", "sums_broken",
                 "--model_name_or_path", tiny_chatml_model, "--num_eval_games", "3", "--max_turns", "1",
                 "--results_dir", str(tmp_path / "results"), "--no_progress"], tmp_path, sums_package)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = [line for line in done.stderr.splitlines() if "error" in line.lower()]  # besides the loading bar
    assert "all 3 held-out tasks failed" in line and "no 'a' or 'b' column: give both numbers" in line
    assert "nan" not in done.stdout and not (tmp_path / "results").exists()


def test_eval_of_a_recipe_whose_model_is_not_trained_refuses_naming_the_folder_and_the_command(tmp_path, monkeypatch,
                                                                                              capsys):
    """`eval --config quickstart` with no trained GRPO model evaluates nothing else in its place (neither
    the recipe's SFT start nor any other model, whose card stays as it was)."""
    monkeypatch.chdir(tmp_path)
    sft = tmp_path / "outputs" / "quickstart_sft"
    sft.mkdir(parents=True)
    (sft / "config.json").write_text("{}")  # the start is there, the trained model is not
    assert main(["eval", "--config", "quickstart"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "outputs/quickstart_grpo/config.json" in line and "trl-multiturn train grpo --config" in line
    assert "--model_name_or_path" in line and list(sft.iterdir()) == [sft / "config.json"]


def test_the_offline_default_is_evaluated_into_a_folder_of_its_own(tiny_chatml_model, tmp_path, monkeypatch,
                                                                  textworld_games_dir):
    """The offline default resolves to the shared model cache; its results go to outputs/eval/<model>, never
    there (here the tiny model stands in for the converted checkpoint, which is slow to play on CPU)."""
    import trl_multiturn.commands.script_args as script_args
    from trl_multiturn.models import OFFLINE_DEFAULT_MODEL

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(script_args, "resolve_model",
                        lambda name: tiny_chatml_model if name == OFFLINE_DEFAULT_MODEL else name)
    before = sorted(Path(tiny_chatml_model).iterdir())
    assert main(["eval", "--num_eval_games", "1", "--max_turns", "1", "--games_dir", str(textworld_games_dir),
                 "--no_progress"]) == 0
    assert sorted(Path(tiny_chatml_model).iterdir()) == before
    (results,) = (tmp_path / "outputs" / "eval" / "offline-smollm2-135m-instruct").glob("eval_results_*.json")
    assert json.loads(results.read_text())["summary"]["n"] == 1

