"""Bad input to `trl-multiturn train`/`eval`/`play` and the examples is one line naming the field (and the YAML file
and key, for a recipe's), with a did-you-mean where a name is misspelt: no usage wall, no prefix matching, no TRL
advice a command-line user cannot follow."""

import subprocess
import sys
from pathlib import Path

from trl_multiturn.commands.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _one_error_line(argv, capsys) -> str:
    """The error `main(argv)` prints, asserting it is one line and the exit code is 2."""
    try:
        code = main(argv)
    except SystemExit as done:
        code = done.code
    assert code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "usage:" not in captured.err and "Traceback" not in captured.err, captured.err
    return lines[0]


def test_a_bad_value_on_the_command_line_is_one_line(capsys):
    line = _one_error_line(["train", "grpo", "--max_steps", "two"], capsys)
    assert "--max_steps" in line and "invalid int value: 'two'" in line


def test_a_prefix_of_an_option_is_refused_with_a_suggestion(capsys):
    line = _one_error_line(["train", "grpo", "--max_step", "2"], capsys)
    assert "unrecognized arguments: --max_step 2" in line and "did you mean '--max_steps'?" in line
    line = _one_error_line(["eval", "--num_eval_game", "2"], capsys)
    assert "did you mean '--num_eval_games'?" in line


def test_a_bad_yaml_value_names_the_file_and_the_key(tmp_path, capsys):
    config = tmp_path / "mine.yaml"
    config.write_text("learning_rate: fast\n")
    line = _one_error_line(["train", "grpo", "--config", str(config)], capsys)
    assert line.startswith("trl-multiturn train grpo: error: ") and f"{config}: learning_rate:" in line
    assert "'fast'" in line and "--learning_rate" not in line


def test_a_yaml_choice_outside_its_choices_is_one_line_naming_the_choices(tmp_path, capsys):
    config = tmp_path / "mine.yaml"
    config.write_text("reward_mode: denser\n")
    line = _one_error_line(["train", "grpo", "--config", str(config)], capsys)
    assert "reward_mode" in line and "'denser' (choose from 'sparse', 'dense', 'shaped', 'dense_scaled')" in line


def test_an_unknown_yaml_key_is_named_with_a_suggestion_and_no_trl_advice(tmp_path, capsys):
    config = tmp_path / "mine.yaml"
    config.write_text("lerning_rate: 0.1\nmax_steps: 1\n")
    line = _one_error_line(["train", "grpo", "--config", str(config)], capsys)
    assert f"{config}: 'lerning_rate' is not a field" in line and "did you mean 'learning_rate'?" in line
    assert "fail_with_unknown_args" not in line


def test_a_misspelt_recipe_name_gets_a_suggestion(capsys):
    for command in (["train", "grpo"], ["eval"], ["play"]):
        line = _one_error_line([*command, "--config", "quikstart"], capsys)
        assert "--config 'quikstart'" in line and "did you mean 'quickstart'?" in line


def test_play_and_eval_take_cpu_threads(capsys):
    """`play --cpu_threads 1` is a field (not 30 lines of usage): the run goes on to the model, missing here."""
    for command in ("eval", "play"):
        line = _one_error_line([command, "--cpu_threads", "1", "--model_name_or_path", "/no/such/model"], capsys)
        assert "--model_name_or_path '/no/such/model': no such folder" in line
    line = _one_error_line(["play", "--cpu_threads", "0"], capsys)
    assert "cpu_threads=0" in line


def test_an_example_gives_the_same_one_line_errors(tmp_path):
    config = tmp_path / "mine.yaml"
    config.write_text("learning_rate: fast\n")
    for argv in (["--max_step", "2"], ["--config", str(config)], ["--config", "quikstart"]):
        done = subprocess.run([sys.executable, str(ROOT / "examples" / "textworld_grpo.py"), *argv],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "error:" in lines[0] and "usage:" not in done.stderr, done.stderr
    assert "did you mean 'quickstart'?" in lines[0]
