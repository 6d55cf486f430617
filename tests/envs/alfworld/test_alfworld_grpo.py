"""ALFWorld with the rollout and the trainer: token-exact episodes and env_mask on real ALFWorld observations,
MultiTurnGRPOTrainer training on generated ALFWorld games, and the example script's configuration."""

import json
import math
import runpy
from pathlib import Path

import pytest
from conftest import tiny_rl_args
from rollout_checks import assert_env_mask_exact, assert_token_exact
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import TrlParser

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
from trl_multiturn.envs import ALFWorldEnv
from trl_multiturn.envs.alfworld import ALFWorldConfig, list_tasks
from trl_multiturn.envs.alfworld.generator import ALFWorldGenConfig, generate_games
from trl_multiturn.expert import expert_trajectories
from trl_multiturn.model_setup import ModelSetup
from trl_multiturn.models import OFFLINE_DEFAULT_MODEL
from trl_multiturn.rollout import EpisodeRunner
from trl_multiturn.rollout.generation import hf_generate_fn
from trl_multiturn.rollout.rules import EpisodeRules

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "alfworld"


@pytest.fixture(scope="module")
def games(tmp_path_factory):
    """One generated look_at_obj_in_light and one pick_and_place_simple game, as task rows."""
    out = tmp_path_factory.mktemp("alfworld-games")
    generate_games(out, seeds=[0], task_types=["look_at_obj_in_light", "pick_and_place_simple"])
    return list_tasks(out)


def scripted(actions):
    """An action parser that plays `actions` in order, whatever the (random) tiny model replies."""
    remaining = iter(actions)
    return lambda reply: next(remaining)


def play(model_path, row, actions):
    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_path), AutoTokenizer.from_pretrained(model_path)
    rules = EpisodeRules(max_turns=len(actions), max_completion_length=6, action_parser=scripted(actions))
    runner = EpisodeRunner(ALFWorldEnv, tokenizer, hf_generate_fn(model, tokenizer), rules)
    [episode] = runner([row])
    runner.close()
    assert_token_exact(model, episode)
    assert_env_mask_exact(tokenizer, episode)
    return episode


def test_token_exact_and_env_mask_on_the_real_alfworld_game(tiny_model):
    if not list(FIXTURE.glob("json_2.1.1/train/*/*/game.tw-pddl")):
        pytest.fail(f"The real ALFWorld game fixture is missing under {FIXTURE}.")
    row = list_tasks(FIXTURE)[0]
    episode = play(tiny_model, row, ["go to microwave 1", "open microwave 1", "go to countertop 2"])
    goal = "Your task is to: heat some potato and put it in sinkbasin."
    assert episode.prompt_messages[-1]["content"].endswith(goal)
    assert episode.observations[0] == "You arrive at microwave 1. The microwave 1 is closed."
    assert episode.observations[1] == "You open the microwave 1. The microwave 1 is open. In it, you see nothing."
    assert episode.observations[2].startswith("You arrive at countertop 2. On the countertop 2, you see")
    assert not episode.won and episode.truncated and episode.turn_rewards == [0.0, 0.0, 0.0]


def test_a_won_alfworld_episode_is_token_exact_with_the_win_on_its_last_turn(tiny_model, games):
    [row] = [row for row in games if row["task_type"] == "look_at_obj_in_light"]
    walkthrough = ALFWorldEnv().expert_actions(row)
    episode = play(tiny_model, row, walkthrough)
    assert episode.won and episode.done and not episode.truncated
    assert episode.num_turns == len(walkthrough)
    assert episode.turn_rewards == [0.0] * (len(walkthrough) - 1) + [1.0]
    assert episode.observations[-1].startswith("You turn on the")


def test_grpo_trains_two_steps_on_generated_alfworld_games(tiny_chatml_model, tmp_path, games):
    tasks = games
    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path / "out", max_turns=3, max_completion_length=8)
    trainer = MultiTurnGRPOTrainer(model=tiny_chatml_model, args=args, environment_factory=ALFWorldEnv,
                                   train_dataset=tasks)
    result = trainer.train()
    assert trainer.state.global_step == 2 and math.isfinite(result.training_loss)
    logged = [log for log in trainer.state.log_history if "episodes/success_rate" in log]
    assert len(logged) == 2 and all(log["episodes/failed"] == 0 for log in logged)
    assert all(0 < log["episodes/trained_token_fraction"] < 1 for log in logged)
    episode = trainer.episode_runner([tasks[0]])[0]
    assert episode.prompt_messages[-1]["content"].startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert episode.num_turns == 3 and len(episode.observations) == 3


def _example():
    return runpy.run_path(str(Path(__file__).resolve().parents[3] / "examples" / "alfworld_grpo.py"),
                          run_name="alfworld_grpo_example")


def _parse(example, argv):
    parser = TrlParser((example["ScriptArguments"], MultiTurnGRPOConfig, ALFWorldConfig, ALFWorldGenConfig,
                        ModelSetup))
    parser.set_defaults_with_config(**example["SMOKE_DEFAULTS"])
    return parser.parse_args_and_config(argv)


def test_example_defaults_are_sft_then_grpo_then_side_by_side_and_the_recipe_is_paper_scale():
    example = _example()
    script, training, env, gen, _ = _parse(example, [])
    assert script.model_name_or_path == OFFLINE_DEFAULT_MODEL and script.num_sft_games > 0 and script.warm_start_path
    assert script.num_eval_games > 0 and script.eval_start_model
    assert training.bf16 == example["cpu_has_native_bf16"]()  # emulated bf16 would be slower than fp32
    # Groups whose episodes all win still rank: a faster win returns more.
    assert training.turn_gamma < 1 and training.num_generations > 2
    # 8 episodes a step in micro-batches: the loss over 8 ALFWorld episodes at once peaked at 9 GB.
    assert training.per_device_train_batch_size * training.gradient_accumulation_steps == 8
    assert training.per_device_train_batch_size <= 2
    recipe = str(Path(__file__).resolve().parents[3] / "recipes" / "alfworld_grpo.yaml")
    script, training, env, gen, _ = _parse(example, ["--config", recipe, "--bf16", "false", "--use_cpu", "true"])
    assert script.model_name_or_path.startswith("Qwen/Qwen2.5-") and script.warm_start_path
    assert training.max_turns == 24 and env.admissible_commands and gen.num_receptacles > 8
    # Nothing of the CPU demonstration leaks into the paper-scale recipe.
    assert script.num_sft_games == 0 and script.task_types is None and script.eval_task_types is None
    assert not script.eval_start_model and training.turn_gamma == 1.0 and training.max_steps == 300


def test_the_no_argument_run_trains_sft_then_grpo_and_prints_held_out_side_by_side(
        tiny_chatml_model, tmp_path, monkeypatch, capsys):
    """The headline command's three stages on disjoint games, with the tiny model and one game per stage."""
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "not-downloaded"))
    example = _example()
    sft_dir, out = tmp_path / "sft", tmp_path / "grpo"
    argv = ["--model_name_or_path", tiny_chatml_model, "--games_dir", str(tmp_path / "games"),
            "--warm_start_path", str(sft_dir), "--output_dir", str(out), "--num_sft_games", "1",
            "--num_train_games", "1", "--num_eval_games", "1", "--sft_epochs", "1", "--sft_batch_size", "1",
            "--num_generations", "2", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1",
            "--max_steps", "1", "--max_turns", "2",
            "--max_completion_length", "4", "--disable_tqdm", "true"]
    games = example["main"](*_parse(example, argv))
    files = {stage: set(rows["game_file"]) for stage, rows in games.items()}
    assert sorted(files) == ["eval", "sft", "train"] and all(len(f) == 1 for f in files.values())
    assert not (files["sft"] & files["train"]) and not (files["eval"] & (files["sft"] | files["train"]))
    assert (sft_dir / "config.json").is_file() and (out / "config.json").is_file()
    printed = capsys.readouterr().out
    start = printed.index("starting model, greedy evaluation on 1 valid_unseen games")
    side = printed.index("held-out success, the same games:")
    # GRPO started from the SFT checkpoint: the side-by-side names it as the start.
    assert start < side and f"  {sft_dir}" in printed and "+ MultiTurnGRPOTrainer" in printed
    assert "exact McNemar p" in printed[side:]
    after = json.loads((out / "eval_results.json").read_text())
    before = json.loads((out / "start_eval_results.json").read_text())  # the paired test recomputes from files
    assert after["summary"]["n"] == before["summary"]["n"] == 1 and before["model"] == str(sft_dir)
    assert [o["task"] for o in before["outcomes"]] == [o["task"] for o in after["outcomes"]]


def test_game_sets_refuse_sft_games_that_are_rl_games(tmp_path, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "not-downloaded"))
    example = _example()
    script, training, env, gen, _ = _parse(example, ["--games_dir", str(tmp_path / "games"), "--num_sft_games", "1",
                                                     "--num_train_games", "1", "--num_eval_games", "0"])
    sets = example["game_sets"](script, env, gen, 0)
    assert len(sets["sft"]) == 1 and not set(sets["sft"]["game_file"]) & set(sets["train"]["game_file"])
    script.sft_first_game = 0  # the same seeds as the RL games: the SFT set loses them
    assert len(example["game_sets"](script, env, gen, 0)["sft"]) == 0


def test_eval_first_game_gives_held_out_games_no_earlier_run_was_judged_on(tmp_path, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "not-downloaded"))
    example = _example()
    script, training, env, gen, _ = _parse(example, ["--games_dir", str(tmp_path / "games"), "--num_sft_games", "0",
                                                     "--num_train_games", "1", "--num_eval_games", "2"])
    first = set(example["game_sets"](script, env, gen, 0)["eval"]["game_file"])
    script.eval_first_game = 1  # the second held-out game on: one shared with the default set, one new
    later = set(example["game_sets"](script, env, gen, 0)["eval"]["game_file"])
    assert len(first) == len(later) == 2 and len(first & later) == 1


def test_example_generates_games_when_no_dataset_is_configured(tmp_path, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "not-downloaded"))
    example = _example()
    script, training, env, gen, _ = _parse(example, ["--games_dir", str(tmp_path / "games"),
                                                     "--task_types", "pick_and_place_simple"])
    tasks = example["alfworld_tasks"](script, env, gen, "train", 2, training.seed)
    assert len(tasks) == 2 and set(tasks["task_type"]) == {"pick_and_place_simple"}
    assert all(row["game_file"].startswith(str(tmp_path / "games")) for row in tasks)


def test_expert_trajectories_make_won_sft_episodes(tiny_chatml_model, games):
    tokenizer = AutoTokenizer.from_pretrained(tiny_chatml_model)
    data = expert_trajectories(ALFWorldEnv(), games, tokenizer)
    assert len(data) == len(games)
    for row, task in zip(data, games):
        replies = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        assert replies == ALFWorldEnv().expert_actions(task) and row["num_turns"] == len(replies)
        assert row["messages"][0]["content"].endswith(f"Your task is to: {task['goal']}.")
        assert sum(row["assistant_masks"]) > 0 and len(row["input_ids"]) == len(row["assistant_masks"])

