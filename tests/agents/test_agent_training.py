"""Agents train with MultiTurnGRPOTrainer through the chat endpoint: a smolagents tool-calling agent (a real agent
framework, which rewrites its history, so its calls become step samples of one episode) and a hand-written loop on
the `openai` client (every call joins one trajectory sample). The ids trained are the ids the model sampled."""

import inspect
import json
import runpy
from importlib.resources import files
from pathlib import Path

import pytest
import torch
import yaml
from conftest import tiny_rl_args
from datasets import Dataset
from smolagents import OpenAIServerModel, ToolCallingAgent, tool
from toy_envs import openai_loop_agent
from transformers import AutoTokenizer
from trl import TrlParser

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
from trl_multiturn.agents import AgentEnvironment, AgentResult, AgentRunner
from trl_multiturn.rollout.rules import EpisodeRules


@tool
def go(direction: str) -> str:
    """Move to the next room.

    Args:
        direction: where to go, e.g. north.
    """
    return f"You go {direction}. You see a chest."


def short_prompts() -> dict:
    """smolagents' tool-calling prompts with a one-line system prompt (its own is ~3000 tokens: slow on CPU)."""
    templates = yaml.safe_load(files("smolagents.prompts").joinpath("toolcalling_agent.yaml").read_text())
    return {**templates, "system_prompt": "Solve the task with your tools, then call final_answer."}


def smolagents_agent(task, session):
    """A smolagents tool-calling agent, as its user would write it, pointed at the training endpoint. Its reward
    (a stand-in for a task's check, with signal under a random policy): the final answer's length."""
    model = OpenAIServerModel(model_id=session.model, api_base=session.base_url, api_key=session.api_key,
                              client_kwargs={"max_retries": 0})
    agent = ToolCallingAgent(tools=[go], model=model, max_steps=2, verbosity_level=0, prompt_templates=short_prompts())
    answer = agent.run(task["goal"])
    return AgentResult(reward=len(str(answer)) / 100, won=len(str(answer)) > 20)


class Recorded:
    """Wraps the trainer's generate function: records what the model was given and what it sampled (per context,
    every sample: episodes of one task start from the same context)."""

    def __init__(self, generate):
        self.generate, self.sampled = generate, {}

    def __call__(self, contexts, max_new_tokens):
        completions, logprobs = self.generate(contexts, max_new_tokens)
        for context, done in zip(contexts, completions):
            self.sampled.setdefault(tuple(context), []).append(list(done))
        return completions, logprobs


GOALS = [{"goal": "Go north and open the chest."}] * 2 + [{"goal": "Find the key."}] * 2


def make_trainer(model, tmp_path, agent, **overrides):
    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, max_steps=1, reward_mode="dense",
                        **{"max_turns": 4, **overrides})
    trainer = MultiTurnGRPOTrainer(model=model, args=args, environment_factory=AgentEnvironment(agent),
                                   train_dataset=Dataset.from_list(GOALS))
    recorded = Recorded(trainer.episode_runner.generate_fn)
    trainer.episode_runner.generate_fn = recorded
    return trainer, recorded


def scored(trainer):
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer._generate_and_score_completions(list(GOALS))


def trl_row(inputs, row):
    """The prompt ids, completion ids and trained mask of TRL's row `row`."""
    prompt = inputs["prompt_ids"][row][inputs["prompt_mask"][row].bool()].tolist()
    mask = inputs["completion_mask"][row] * inputs.get("tool_mask", torch.ones_like(inputs["completion_mask"]))[row]
    return prompt, inputs["completion_ids"][row].tolist(), mask.tolist()


def assert_trains(trainer):
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert trainer.state.global_step == 1
    assert any(not torch.equal(b, a) for b, a in zip(before, trainer.model.parameters()))


def test_a_smolagents_agent_with_tools_trains_on_the_step_samples_it_sampled(tiny_chatml_model, tmp_path):
    trainer, recorded = make_trainer(tiny_chatml_model, tmp_path, smolagents_agent)
    assert isinstance(trainer.episode_runner, AgentRunner)
    torch.manual_seed(0)
    inputs = scored(trainer)
    batch, stats = trainer.last_rollout, trainer.episode_runner.last_stats
    assert not any(ep.failed for ep in batch.episodes), [ep.failure for ep in batch.episodes]
    assert stats["stepwise"] == 1 and stats["new_samples"] > len(GOALS)  # smolagents rewrote its history
    steps = [s for s in batch.steps if s is not None]
    assert len(steps) == sum(ep.num_turns for ep in batch.episodes) >= 2 * len(GOALS)
    for row, step in enumerate(batch.steps):
        if step is None:
            continue
        prompt, completion, mask = trl_row(inputs, row)
        n = len(step.completion_ids)
        assert prompt == step.prompt_ids and completion[:n] == step.completion_ids and mask[:n] == [1] * n
        assert completion[:n] in recorded.sampled[tuple(prompt)]  # trained ids: the ids sampled from that context
        assert sum(mask[n:]) == 0
    assert_trains(trainer)


def test_an_openai_client_loop_trains_one_trajectory_per_episode(tiny_chatml_model, tmp_path):
    trainer, recorded = make_trainer(tiny_chatml_model, tmp_path, openai_loop_agent)
    torch.manual_seed(0)
    inputs = scored(trainer)
    batch = trainer.last_rollout
    assert batch.steps is None and trainer.episode_runner.last_stats["joined"] == len(GOALS)
    for row, ep in enumerate(batch.episodes):
        assert not ep.failed and ep.num_turns == 2
        prompt, completion, mask = trl_row(inputs, row)
        n = len(ep.completion_ids)
        assert prompt == ep.prompt_ids and completion[:n] == ep.completion_ids and mask[:n] == ep.env_mask
        for start, end in ep.turn_spans:
            assert completion[start:end] in recorded.sampled[tuple(prompt + completion[:start])]
    assert_trains(trainer)


def test_reward_funcs_are_refused_with_an_agent(tiny_chatml_model, tmp_path):
    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path)
    with pytest.raises(ValueError, match="reward_funcs=.*AgentEnvironment"):
        MultiTurnGRPOTrainer(model=tiny_chatml_model, args=args, environment_factory=AgentEnvironment(
            openai_loop_agent), train_dataset=Dataset.from_list(GOALS), reward_funcs=[lambda completions, **kw: [
                0.0] * len(completions)])


def test_dynamic_sampling_with_an_agent_is_refused_in_the_trajectory_format_and_built_step_wise(tiny_chatml_model,
                                                                                                      tmp_path):
    """Each draw of an agent's episodes is step-wise when an agent rewrote its history, so one step's draws could
    come in two formats; step-wise they cannot."""
    with pytest.raises(ValueError, match="dynamic_sampling=True with an agent and episode_format='trajectory'"):
        make_trainer(tiny_chatml_model, tmp_path, openai_loop_agent, dynamic_sampling=True)
    trainer, _ = make_trainer(tiny_chatml_model, tmp_path, openai_loop_agent, dynamic_sampling=True,
                              episode_format="stepwise")
    assert trainer.step.episodes.dynamic is not None


def test_smolagents_runs_the_tool_the_models_template_output_calls(tiny_chatml_model):
    """With a stand-in for a model that knows the task (its two replies scripted as the tiny template's tool-call
    syntax), smolagents receives OpenAI tool calls, runs the tool and finishes with the final_answer tool."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_chatml_model)
    script = [{"name": "go", "arguments": {"direction": "north"}},
              {"name": "final_answer", "arguments": {"answer": "opened"}}]

    def generate(contexts, max_new_tokens):
        replies = []
        for context in contexts:
            step = int("You go north." in tokenizer.decode(context))  # the tool ran: finish
            text = f"<tool_call>\n{json.dumps(script[step])}\n</tool_call>"
            replies.append(tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id])
        return replies, None

    seen = {}

    def agent(task, session):
        answer = ToolCallingAgent(tools=[go], model=OpenAIServerModel(
            model_id=session.model, api_base=session.base_url, api_key=session.api_key), max_steps=3,
            verbosity_level=0).run("Open the chest.")
        seen["answer"] = answer
        return 1.0

    runner = AgentRunner(AgentEnvironment(agent), tokenizer, generate,
                         EpisodeRules(max_turns=4, max_completion_length=200))
    try:
        (ep,) = runner([{}])
    finally:
        runner.close()
    assert not ep.failed and seen["answer"] == "opened" and ep.num_turns == 2
    assert "You go north. You see a chest." in ep.observations[0]


def test_the_agent_example_trains_and_saves(tiny_chatml_model, tmp_path):
    example = runpy.run_path(str(Path(__file__).resolve().parents[2] / "examples" / "agent_grpo.py"),
                             run_name="example")
    classes = [p.annotation for p in inspect.signature(example["main"]).parameters.values()]
    args = TrlParser(tuple(classes)).parse_args_and_config(args=[
        "--model_name_or_path", tiny_chatml_model, "--output_dir", str(tmp_path), "--max_steps", "1",
        "--num_tasks", "4", "--num_generations", "2", "--per_device_train_batch_size", "4",
        "--max_completion_length", "8", "--use_cpu", "true", "--bf16", "false", "--report_to", "none",
        "--save_strategy", "no"])
    example["main"](*args)
    saved = json.loads((tmp_path / "episode_settings.json").read_text())
    assert saved["environment"]["class"] == "trl_multiturn.agents.runner:AgentEnvironment"
    assert json.loads((tmp_path / "trainer_state.json").read_text())["global_step"] == 1
