"""mini-swe-agent, the PyPI package unmodified with its own `mini.yaml`, on SWE-Gym through the training endpoint: its
commands run in the episode's sandbox, never on the host; the episode is graded as SWEGymEnv grades it; two GRPO steps
train on exactly the ids sampled, and no sandbox folder or process is left behind."""

import json
import math
import secrets
import tempfile
from pathlib import Path

import psutil
import pytest
from conftest import assert_trained_ids_are_sampled, record_sampled, tiny_rl_args
from datasets import Dataset
from transformers import AutoTokenizer

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
from trl_multiturn.agents import AgentRunner
from trl_multiturn.agents.mini_swe_agent import mini_swe_agent_environment, mini_swe_agent_settings
from trl_multiturn.envs.swegym import SWEGymConfig, load_tasks
from trl_multiturn.rollout.rules import EpisodeRules


@pytest.fixture
def env_config(swegym_cache_dir):
    return SWEGymConfig(repo_cache_dir=swegym_cache_dir, command_timeout=20, reward="dense")


def sandbox_folders() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("swegym-*")}


def test_mini_swe_agents_commands_run_in_the_sandbox_and_its_diff_is_graded(tiny_chatml_model, env_config):
    """With a stand-in for a model that knows what to do (its replies scripted in the template's tool-call syntax):
    mini's bash tool call runs in the sandbox, its submit command ends the episode, and the grade is the reward."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_chatml_model)
    marker = f"/tmp/mini-swe-agent-{secrets.token_hex(6)}"
    script = [f"echo touched > MINI_WAS_HERE.txt && echo host > {marker}; cat MINI_WAS_HERE.txt",
              "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]

    def generate(contexts, max_new_tokens):
        replies = []
        for context in contexts:
            step = tokenizer.decode(context).count("<tool_response>")  # the tool outputs mini sent back so far
            call = {"name": "bash", "arguments": {"command": script[step]}}
            replies.append(tokenizer.encode(f"<tool_call>\n{json.dumps(call)}\n</tool_call>",
                                            add_special_tokens=False) + [tokenizer.eos_token_id])
        return replies, None

    before = sandbox_folders()
    runner = AgentRunner(mini_swe_agent_environment(env_config, step_limit=4), tokenizer, generate,
                         EpisodeRules(max_turns=4, max_completion_length=200))
    try:
        (ep,) = runner(list(load_tasks(["rpn"])))
    finally:
        runner.close()
    assert not ep.failed, ep.failure
    info = ep.turns[-1].info
    assert info["exit_status"] == "Submitted" and ep.num_turns == 2
    assert info["commands"] == [{"command": script[0], "exit_code": 0}, {"command": script[1], "exit_code": 0}]
    assert "touched" in ep.observations[0]  # the command's output came back to the agent, in mini's template
    assert "MINI_WAS_HERE.txt" in info["patch"] and "+touched" in info["patch"]  # graded: the sandbox's diff
    assert info["patch_applied"] and info["f2p_total"] > 0 and not info["resolved"] and not ep.won
    assert ep.turns[-1].reward == info["f2p_passed"] / info["f2p_total"]
    assert not Path(marker).exists()  # the command wrote inside the sandbox, not on the host
    assert sandbox_folders() <= before


def test_mini_swe_agent_trains_two_grpo_steps_on_shipped_swegym_tasks(tiny_chatml_model, tmp_path, env_config):
    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, max_steps=2, reward_mode="dense", max_turns=3,
                        max_completion_length=8, num_generations=2, per_device_train_batch_size=2)
    tasks = Dataset.from_list(list(load_tasks(["rpn"])))
    trainer = MultiTurnGRPOTrainer(model=tiny_chatml_model, args=args, train_dataset=tasks,
                                   environment_factory=mini_swe_agent_environment(env_config, step_limit=3))
    sampled = record_sampled(trainer)
    before, children = sandbox_folders(), {p.pid for p in psutil.Process().children(recursive=True)}
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    inputs = trainer._generate_and_score_completions(list(tasks) * 2)
    batch = trainer.last_rollout
    assert not any(ep.failed for ep in batch.episodes), [ep.failure for ep in batch.episodes]
    for ep in batch.episodes:  # a random model makes no tool call: mini stops on its format errors, then grading
        info = ep.turns[-1].info
        assert info["exit_status"] in ("RepeatedFormatError", "LimitsExceeded") or info["exit_status"].startswith(
            "refused"), info["exit_status"]
        assert "f2p_total" in info and info["f2p_total"] > 0 and info["patch"] == ""
    assert_trained_ids_are_sampled(inputs, batch, sampled)
    result = trainer.train()  # every grade is 0 (no patch): zero advantages, so the weights do not move
    assert trainer.state.global_step == 2 and math.isfinite(result.training_loss)
    logged = [log for log in trainer.state.log_history if "episodes/failed" in log]
    assert len(logged) == 2 and all(log["episodes/failed"] == 0 for log in logged)
    assert sandbox_folders() <= before  # every episode's sandbox was removed
    left = {p.pid for p in psutil.Process().children(recursive=True)} - children
    assert not [psutil.Process(pid).cmdline() for pid in left if psutil.pid_exists(pid)]


def test_mini_swe_agents_settings_are_its_own_config_file():
    settings = mini_swe_agent_settings("mini.yaml", step_limit=7)
    assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in settings["agent"]["instance_template"]
    assert settings["agent"]["step_limit"] == 7 and settings["environment"]["env"]["PAGER"] == "cat"
