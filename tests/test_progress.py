"""Progress bars on the slow loops (TextWorld and ALFWorld game generation, evaluation), and the ways to turn them
off: the call's flag, a trainer config's `disable_tqdm`, and huggingface_hub's global switch."""

import pytest
from huggingface_hub.utils import disable_progress_bars, enable_progress_bars
from toy_envs import CountingEnv

from trl_multiturn.commands.train import evaluation_options
from trl_multiturn.envs.alfworld.generator import generate_games
from trl_multiturn.envs.textworld.tasks import textworld_tasks
from trl_multiturn.evaluation import evaluate
from trl_multiturn.rollout.rules import EpisodeRules

pytestmark = pytest.mark.filterwarnings("ignore::jericho.UnsupportedGameWarning")


def test_textworld_game_generation_shows_progress(textworld_games_dir, capsys):
    textworld_tasks(1, 2, 2, split="validation", num_games=2, games_dir=str(textworld_games_dir))
    err = capsys.readouterr().err
    assert "TextWorld validation games: 100%" in err and "2/2" in err
    textworld_tasks(1, 2, 2, split="validation", num_games=2, games_dir=str(textworld_games_dir), progress=False)
    assert "TextWorld" not in capsys.readouterr().err


def test_alfworld_game_generation_shows_progress(tmp_path, capsys):
    generate_games(tmp_path, [0], ["pick_and_place_simple"], "train")
    err = capsys.readouterr().err
    assert "ALFWorld train games" in err and "1/1" in err
    generate_games(tmp_path, [0], ["pick_and_place_simple"], "train", progress=False)
    assert "ALFWorld" not in capsys.readouterr().err


def test_evaluate_shows_progress_unless_turned_off(tiny_chatml_model, capsys):
    tasks = [{"target": 1}] * 3
    rules = EpisodeRules(max_turns=1, max_completion_length=2,
                         action_parser="trl_multiturn.rollout.parsing:whole_reply")
    options = dict(rules=rules, env_mode="inline", batch_size=2)
    evaluate(tiny_chatml_model, CountingEnv, tasks, **options)
    err = capsys.readouterr().err
    assert "evaluate: 100%" in err and "3/3" in err
    evaluate(tiny_chatml_model, CountingEnv, tasks, progress=False, **options)
    assert "evaluate" not in capsys.readouterr().err
    disable_progress_bars()
    try:
        evaluate(tiny_chatml_model, CountingEnv, tasks, **options)
        assert "evaluate" not in capsys.readouterr().err
    finally:
        enable_progress_bars()


def test_evaluation_progress_moves_per_task_within_a_batch(tiny_chatml_model, monkeypatch):
    """One batch of three tasks ending at turns 1, 2 and 3: the bar reaches 1/3 and 2/3 before the batch ends (it
    moved once per batch before), with the turn reached."""
    from trl_multiturn import progress

    seen = []

    class Recording(progress.TurnProgress):
        def __call__(self, finished, episodes, turn):
            super().__call__(finished, episodes, turn)
            seen.append((self.bar.n, self.bar.total, turn))

    monkeypatch.setattr(progress, "TurnProgress", Recording)
    rules = EpisodeRules(max_turns=3, max_completion_length=2,
                         action_parser="trl_multiturn.rollout.parsing:whole_reply")
    evaluate(tiny_chatml_model, CountingEnv, [{"target": 1}, {"target": 2}, {"target": 3}], rules=rules,
             env_mode="inline", batch_size=3)
    assert seen[0] == (0, 3, 0) and (1, 3, 1) in seen and (2, 3, 2) in seen and seen[-1] == (3, 3, 3)


def test_turn_progress_counts_across_batches_or_per_call(capsys):
    """With a total, one bar over every call's episodes; without, a new bar per call (a training step's rollout)."""
    from trl_multiturn.progress import TurnProgress

    with TurnProgress("evaluate", total=5) as bar:
        for finished, episodes, turn in [(0, 3, 0), (2, 3, 1), (3, 3, 2), (0, 2, 0), (1, 2, 1)]:
            bar(finished, episodes, turn)
        assert (bar.bar.n, bar.bar.total) == (4, 5)
    step = TurnProgress("rollout")
    step(0, 4, 0)
    step(1, 4, 1)
    first = step.bar
    assert (first.n, first.total) == (1, 4)
    step(0, 6, 0)
    assert step.bar is not first and (step.bar.n, step.bar.total) == (0, 6)
    step(6, 6, 3)
    assert step.bar is None  # every episode ended: the bar is closed


def test_a_trainer_configs_disable_tqdm_turns_evaluation_progress_off(tmp_path):
    from trl_multiturn import MultiTurnGRPOConfig

    quiet = MultiTurnGRPOConfig(output_dir=str(tmp_path), disable_tqdm=True, use_cpu=True, report_to="none")
    loud = MultiTurnGRPOConfig(output_dir=str(tmp_path), disable_tqdm=False, use_cpu=True, report_to="none")
    assert evaluation_options(quiet)["progress"] is False and evaluation_options(loud)["progress"] is True


@pytest.mark.parametrize("disable_tqdm", [False, True])
def test_training_prints_one_short_line_per_logged_step_and_logs_every_metric(tiny_chatml_model, tmp_path, capsys,
                                                                               disable_tqdm):
    """The console gets `step k/2 | success ... | loss ... | s/step` per step (above the tqdm bar, or printed under
    `disable_tqdm`), not transformers' metrics dict; `state.log_history` keeps every metric."""
    import re

    from conftest import tiny_rl_args
    from datasets import Dataset

    from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer

    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, max_turns=1, max_completion_length=2,
                        per_device_train_batch_size=2, disable_tqdm=disable_tqdm, env_mode="inline")
    trainer = MultiTurnGRPOTrainer(model=tiny_chatml_model, args=args, environment_factory=CountingEnv,
                                   train_dataset=Dataset.from_list([{"target": 1}] * 4))
    capsys.readouterr()
    trainer.train()
    out = capsys.readouterr().out
    line = r"step {}/2 \| success \d\.\d\d \| return -?\d+\.\d\d \| turns \d\.\d \| failed 0 \| loss \S+ \| " \
           r"\d+\.\d s/step\n"
    assert [bool(re.search(line.format(step), out)) for step in (1, 2)] == [True, True], out
    assert "{'loss'" not in out and "'episodes/" not in out and "grad_norm" not in out
    assert re.search(r"step 2/2 \| train_runtime \S+ \|", out)  # the end-of-training summary, on one line too
    steps = [log for log in trainer.state.log_history if "loss" in log]
    assert [log["step"] for log in steps] == [1, 2]
    assert all({"episodes/success_rate", "episodes/mean_tokens", "episodes/truncated", "grad_norm",
                "learning_rate", "step_time"} <= set(log) for log in steps)


def test_a_training_step_shows_its_rollout_turn_by_turn(tiny_chatml_model, tmp_path, capsys):
    """Within a step, a `rollout` bar counts the episodes that have ended and the turn reached (before, nothing
    moved until the step ended); `disable_tqdm` turns it off."""
    from conftest import tiny_rl_args
    from datasets import Dataset

    from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
    from trl_multiturn.commands.train import train_and_evaluate

    for disable_tqdm in (False, True):
        args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path / str(disable_tqdm), max_turns=2, max_completion_length=2,
                            per_device_train_batch_size=2, max_steps=1, disable_tqdm=disable_tqdm, env_mode="inline")
        trainer = MultiTurnGRPOTrainer(model=tiny_chatml_model, args=args, environment_factory=CountingEnv,
                                       train_dataset=Dataset.from_list([{"target": 2}] * 4))
        capsys.readouterr()
        train_and_evaluate(trainer, args, None, "tiny")
        err = capsys.readouterr().err
        if disable_tqdm:
            assert "rollout" not in err
        else:
            lines = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("rollout:")]
            assert any("0/2 [" in line and "turn 1]" in line for line in lines), err  # within the step
            assert any("2/2 [" in line and "turn 2]" in line for line in lines), err
