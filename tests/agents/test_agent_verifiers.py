"""verifiers environments (tasksets written here against verifiers 0.4's API, offline) play through the chat endpoint
turn by turn, with their tools (a `vf.Toolset`: verifiers' tool environment), and train with GRPO scored by their own
rubric; a rubric that breaks fails its episode only."""

import json

import pytest
import torch
from conftest import assert_trained_ids_are_sampled, record_sampled, tiny_rl_args
from datasets import Dataset
from transformers import AutoTokenizer

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
from trl_multiturn.agents import AgentRunner
from trl_multiturn.agents.verifiers_suite import verifiers_environment
from trl_multiturn.rollout.rules import EpisodeRules

vf = pytest.importorskip("verifiers.v1", reason="the verifiers extra: pip install 'trl-multiturn[verifiers]'")


class DirectionData(vf.TaskData):
    answer: str = ""
    mode: str = "ok"


class DirectionTask(vf.Task[DirectionData]):
    """Say the direction: 1 for naming it, plus a little for a short reply (signal under a random policy)."""

    @vf.reward
    async def names_it(self, task, trace) -> float:
        if task.mode == "raise":
            raise RuntimeError("rubric crashed")
        return float(task.answer in trace.last_reply)

    @vf.reward(weight=0.5)
    async def brevity(self, task, trace) -> float:
        return 1.0 / (1.0 + len(trace.last_reply))



class SandboxedTask(DirectionTask):
    @vf.reward
    async def in_sandbox(self, task, trace, runtime) -> float:  # needs a runtime: runs only where one is given
        return 0.0


class DirectionTaskset(vf.Taskset[DirectionTask]):
    def __init__(self, config, modes=("ok",) * 4):
        super().__init__(config)
        self.modes = modes

    def load(self):
        for k, mode in enumerate(self.modes):
            direction = ["north", "south"][k % 2]
            yield DirectionTask(DirectionData(prompt=f"Which way? Say {direction}.", system_prompt="Be brief.",
                                              answer=direction, mode=mode), self.config.task)


class Calculator(vf.Toolset[vf.ToolsetConfig]):
    """A local Python tool; its sums are off by 1000, so a reply holding one came from the tool, not the model."""

    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b + 1000


class SumData(vf.TaskData):
    answer: str = ""


class SumTask(vf.Task[SumData]):
    """The tool's answer in the last reply: 1; and 0.5 for a conversation that called the tool."""

    @classmethod
    def toolsets(cls, config):
        return [Calculator(vf.ToolsetConfig())]

    @vf.reward
    async def correct(self, task, trace) -> float:
        return float(task.answer in trace.last_reply)

    @vf.reward(weight=0.5)
    async def used_the_tool(self, task, trace) -> float:
        return float(any(m.role == "tool" for m in trace.messages))

    @vf.reward(weight=0.1)
    async def brevity(self, task, trace) -> float:  # signal under a random policy
        return 1.0 / (1.0 + len(trace.last_reply))


class SumTaskset(vf.Taskset[SumTask]):
    def load(self):
        for a, b in [(2, 3), (4, 5)]:
            yield SumTask(SumData(prompt=f"What is {a} + {b}? Use the add tool.", answer=str(a + b + 1000)),
                          self.config.task)


def taskset(modes=("ok",) * 4):
    return DirectionTaskset(vf.TasksetConfig(id="directions"), modes)


def test_the_rubric_scores_the_reply_the_model_sampled(tiny_chatml_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_chatml_model)
    reply = tokenizer.encode("north", add_special_tokens=False) + [tokenizer.eos_token_id]
    rows, environment = verifiers_environment(taskset(("ok", "ok", "raise", "ok")))
    seen = []

    def generate(contexts, max_new_tokens):
        seen.extend(tokenizer.decode(c) for c in contexts)
        return [reply for _ in contexts], None

    runner = AgentRunner(environment, tokenizer, generate, EpisodeRules(max_turns=2, max_completion_length=8))
    try:
        episodes = runner(rows)
    finally:
        runner.close()
    assert rows[0] == {"verifiers_task": 0, "prompt": "Which way? Say north."}
    assert any("Be brief." in s and "Say north." in s for s in seen)  # the task's system prompt and prompt
    north, south, crashed, south_again = episodes
    assert crashed.failed and "rubric crashed" in crashed.failure and not south_again.failed
    # verifiers' own sum: names_it 1 + brevity 0.5 / (1 + 5) for "north"; 0 + the same for "south"'s task
    assert north.turn_rewards == [pytest.approx(1.0 + 0.5 / 6)]
    assert south.turn_rewards == [pytest.approx(0.5 / 6)]
    assert north.turns[-1].info["rewards"] == {"names_it": 1.0, "brevity": pytest.approx(1 / 6)}


def test_a_tool_environment_plays_turn_by_turn_with_its_tool_and_its_rubric(tiny_chatml_model):
    """A stand-in for a model that calls the tool (its first reply a tool call in the template's syntax, its second
    the tool's result): verifiers' chat loop sends the tools, runs the call on the toolset, sends the result back,
    and verifiers' rubric scores the whole conversation."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_chatml_model)
    rows, environment = verifiers_environment(SumTaskset(vf.TasksetConfig(id="sums")))
    contexts = []

    def generate(batch, max_new_tokens):
        replies = []
        for context in batch:
            text = tokenizer.decode(context)
            contexts.append(text)
            if "<tool_response>" in text:  # the tool's result, as the model's answer
                reply = text.rsplit("<tool_response>", 1)[1].split("</tool_response>")[0].strip()
            else:
                a, b = (int(x) for x in text.rsplit("What is ", 1)[1].split("?")[0].split(" + "))
                reply = "<tool_call>\n" + json.dumps({"name": "calculator_add", "arguments": {"a": a, "b": b}}) \
                    + "\n</tool_call>"
            replies.append(tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id])
        return replies, None

    runner = AgentRunner(environment, tokenizer, generate, EpisodeRules(max_turns=4, max_completion_length=64))
    try:
        first, second = runner(rows)
        stats = runner.last_stats
    finally:
        runner.close()
    assert stats == {"joined": 2, "new_samples": 2, "failed": 0, "stepwise": 0}  # each episode one token-exact sample
    assert not first.failed and not second.failed, (first.failure, second.failure)
    assert '"name": "calculator_add"' in contexts[0]  # the toolset's tool, named as verifiers names it
    assert first.num_turns == second.num_turns == 2
    assert first.replies[-1].strip() == "1005" and second.replies[-1].strip() == "1009"  # the tool ran
    assert first.turn_rewards[-1] == second.turn_rewards[-1] == pytest.approx(1.0 + 0.5 + 0.1 / 5)  # verifiers' sum
    assert first.turns[-1].info["rewards"] == {"correct": 1.0, "used_the_tool": 1.0, "brevity": pytest.approx(0.2)}
    assert first.turns[-1].info["tool_calls"] == 1


def test_a_rubric_reward_that_needs_a_runtime_fails_the_episode(tiny_chatml_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_chatml_model)

    class NeedsRuntime(vf.Taskset[SandboxedTask]):
        def load(self):
            yield SandboxedTask(DirectionData(prompt="Say north.", answer="north"), self.config.task)

    rows, environment = verifiers_environment(NeedsRuntime(vf.TasksetConfig(id="sandboxed")))
    runner = AgentRunner(environment, tokenizer, lambda c, n: ([[tokenizer.eos_token_id]] * len(c), None),
                         EpisodeRules(max_turns=1, max_completion_length=4))
    try:
        (episode,) = runner(rows)
    finally:
        runner.close()
    assert episode.failed and "in_sandbox" in episode.failure


def test_grpo_trains_a_verifiers_tool_environment_token_exact_with_its_rubric_as_the_reward(tiny_chatml_model,
                                                                                             tmp_path):
    """One GRPO step on the tool environment through the endpoint: the toolset's tool reaches the policy through its
    template, TRL trains on exactly the ids sampled, and each episode's reward is the rubric's sum over its reply."""
    rows, environment = verifiers_environment(SumTaskset(vf.TasksetConfig(id="sums")))
    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, max_steps=1, reward_mode="dense", max_turns=2,
                        per_device_train_batch_size=2)
    trainer = MultiTurnGRPOTrainer(model=tiny_chatml_model, args=args, train_dataset=Dataset.from_list(rows),
                                   environment_factory=environment)
    sampled = record_sampled(trainer)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    inputs = trainer._generate_and_score_completions(rows)
    batch = trainer.last_rollout
    assert not any(ep.failed for ep in batch.episodes), [ep.failure for ep in batch.episodes]
    assert_trained_ids_are_sampled(inputs, batch, sampled)
    assert all("calculator_add" in trainer.processing_class.decode(context) for context in sampled)
    for ep in batch.episodes:  # a random policy calls no tool: one reply, scored by the rubric
        answer, reply = str(1005 if ep.task["verifiers_task"] == 0 else 1009), ep.replies[-1].strip()
        tool = ep.turns[-1].info["tool_calls"]
        assert ep.turn_rewards[-1] == pytest.approx(float(answer in reply) + 0.5 * (tool > 0) + 0.1 / (1 + len(reply)))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert trainer.state.global_step == 1
    assert any(not torch.equal(b, a) for b, a in zip(before, trainer.model.parameters()))
