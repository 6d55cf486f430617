"""Progress bars on the slow loops (TextWorld and ALFWorld game generation, evaluation), and the ways to turn them
off: the call's flag, a trainer config's `disable_tqdm`, and huggingface_hub's global switch."""

import pytest
from huggingface_hub.utils import disable_progress_bars, enable_progress_bars
from toy_envs import CountingEnv

from trl_multiturn.commands.train import evaluation_options
from trl_multiturn.envs.alfworld.generator import generate_games
from trl_multiturn.envs.textworld.tasks import textworld_tasks
from trl_multiturn.evaluation import evaluate

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
    options = dict(max_turns=1, max_reply_tokens=2, action_parser="trl_multiturn.rollout.parsing:whole_reply",
                   env_mode="inline", batch_size=2)
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
