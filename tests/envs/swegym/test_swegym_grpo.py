"""SWE-Gym with the trainers: MultiTurnGRPOTrainer trains on the shipped tasks, and the expert solutions make a
verified SFT dataset."""

import functools
import math

from conftest import tiny_rl_args
from datasets import Dataset

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
from trl_multiturn.envs.swegym import SWEGymConfig, SWEGymEnv, load_tasks
from trl_multiturn.expert import expert_trajectories


def test_grpo_trains_two_steps_on_shipped_tasks(tiny_chatml_model, tmp_path, swegym_cache_dir):
    tasks = load_tasks(["intervals", "rpn"])
    env_config = SWEGymConfig(repo_cache_dir=swegym_cache_dir, command_timeout=5, reward="dense")
    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path / "out", max_turns=2, max_completion_length=8,
                        action_parser="whole_reply", reward_mode="dense", per_device_train_batch_size=2)
    trainer = MultiTurnGRPOTrainer(model=tiny_chatml_model, args=args,
                                   environment_factory=functools.partial(SWEGymEnv, env_config),
                                   train_dataset=Dataset.from_list(list(tasks)))
    result = trainer.train()
    assert trainer.state.global_step == 2 and math.isfinite(result.training_loss)
    logged = [log for log in trainer.state.log_history if "episodes/success_rate" in log]
    assert len(logged) == 2 and all(log["episodes/failed"] == 0 for log in logged)

    # The same runner plays an episode whose final turn carries the grade of the diff finish() submitted.
    episode = trainer.episode_runner([tasks[0]])[0]
    assert episode.done and not episode.failed and episode.num_turns == 2
    assert "<issue>" in episode.prompt_messages[-1]["content"]


def test_expert_trajectories_are_won_sft_conversations(tiny_chatml_model, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_chatml_model)
    env = SWEGymEnv(SWEGymConfig(repo_cache_dir=str(tmp_path / "repos")))
    data = expert_trajectories(env, load_tasks(["lrucache", "semver"]), tokenizer, action_parser="whole_reply")
    assert len(data) == 2
    for row in data:
        replies = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        assert replies[0].startswith("<view ") and "<replace " in replies[1] and replies[-1] == "<submit/>"
        assert sum(row["assistant_masks"]) > 0 and len(row["input_ids"]) == len(row["assistant_masks"])
    env.close()


def test_recipe_maps_onto_the_example_dataclasses():
    import importlib.util
    from pathlib import Path

    from trl import TrlParser

    root = Path(__file__).resolve().parents[3]
    spec = importlib.util.spec_from_file_location("swegym_grpo", root / "examples" / "swegym_grpo.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    parser = TrlParser((example.ScriptArguments, MultiTurnGRPOConfig, SWEGymConfig))
    script, train, env = parser.parse_args_and_config(
        ["--config", str(root / "recipes" / "swegym_grpo.yaml"), "--use_cpu", "true", "--bf16", "false"]
    )  # an unknown key in the recipe would raise here
    assert script.dataset_name is None and train.action_parser == "whole_reply" and train.max_turns == 12
    assert (env.sandbox, env.reward, env.submit_after_turns) == ("local", "resolved", None)
