"""Multi-turn GRPO on an agent written against the OpenAI client: the agent is trained as it is.

    accelerate launch examples/agent_grpo.py --output_dir outputs/agent_grpo --max_steps 20
    python examples/agent_grpo.py --config my_agent.yaml        # any field below or of MultiTurnGRPOConfig

`calculator_agent` is an ordinary tool-calling loop: it shows the model an `add` tool, runs the calls the model
makes, sends back the results and reads the final answer; it would run unchanged against any OpenAI-compatible
server. `AgentEnvironment(calculator_agent)` as the trainer's `environment_factory` runs it once per episode against
the trainer's own chat endpoint (loopback, a per-run key), which serves the policy and records the ids it samples:
what the model was shown and what it sampled is what GRPO trains on. The reward is the agent's own check of the
answer. Every field of `AgentScriptArguments`, `MultiTurnGRPOConfig` and `ModelSetup` can be set in a YAML given with
`--config` or on the command line.
"""

import json
import random
import re
from dataclasses import dataclass, field

from datasets import Dataset
from trl import TrlParser

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
from trl_multiturn.agents import AgentEnvironment, AgentResult
from trl_multiturn.commands.script_args import ModelArguments
from trl_multiturn.model_setup import ModelSetup, model_setup_kwargs

ADD_TOOL = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}


def calculator_agent(task: dict, session) -> AgentResult:
    """Ask for a sum, run the model's `add` calls, and check the final answer (reward 1 for the right number)."""
    client = session.openai()
    messages = [{"role": "system", "content": "Use the add tool, then answer with the number only."},
                {"role": "user", "content": f"What is {task['a']} + {task['b']}?"}]
    for _ in range(3):
        message = client.chat.completions.create(model=session.model, messages=messages, tools=[ADD_TOOL],
                                                 max_tokens=64).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            try:
                args = json.loads(call.function.arguments)
                result = str(int(args["a"]) + int(args["b"]))
            except (ValueError, KeyError, TypeError) as exc:
                result = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    answer = re.findall(r"-?\d+", message.content or "")
    won = bool(answer) and int(answer[-1]) == task["a"] + task["b"]
    return AgentResult(reward=float(won), won=won)


@dataclass
class AgentScriptArguments(ModelArguments):
    """The tasks the agent plays."""

    num_tasks: int = field(default=256, metadata={"help": "Training tasks (random sums)."})
    task_seed: int = field(default=0, metadata={"help": "Seed of the random sums."})
    agent_timeout: float = field(default=300.0, metadata={"help": "Seconds one episode's agent may run."})

    def tasks(self) -> Dataset:
        rng = random.Random(self.task_seed)
        return Dataset.from_list([{"a": rng.randint(0, 99), "b": rng.randint(0, 99)} for _ in range(self.num_tasks)])


def main(script_args: AgentScriptArguments, training_args: MultiTurnGRPOConfig, model_args: ModelSetup) -> None:
    if training_args.reward_mode == "sparse":  # the configs' default; the agent's reward is its check of the answer
        training_args.reward_mode = "dense"
    trainer = MultiTurnGRPOTrainer(
        model=script_args.model_path, args=training_args, train_dataset=script_args.tasks(),
        environment_factory=AgentEnvironment(calculator_agent, agent_timeout=script_args.agent_timeout),
        **model_setup_kwargs(model_args, training_args))
    trainer.train()
    trainer.save_model(training_args.output_dir)


if __name__ == "__main__":
    parser = TrlParser((AgentScriptArguments, MultiTurnGRPOConfig, ModelSetup))
    main(*parser.parse_args_and_config())
