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
