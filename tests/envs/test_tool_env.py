"""TRL-style tool environments: the "tool_calls" action parser (TRL's response parsing) and `ToolEnvironment`."""

import json
import math

import pytest
from conftest import tiny_rl_args
from datasets import Dataset
from toy_envs import CounterTools
from transformers import AutoTokenizer

from trl_multiturn import EpisodeRunner, MultiTurnGRPOConfig, MultiTurnGRPOTrainer
from trl_multiturn.envs.tools import ToolEnvironment, tool_chat_template_kwargs, tool_environment
from trl_multiturn.rollout import get_action_parser
from trl_multiturn.rollout.rules import EpisodeRules
from trl_multiturn.rollout.runner import UNREADABLE_REPLY


def call(name, **arguments):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


MALFORMED = '<tool_call>\n{"name": "add", "argum</tool_call>'


def test_the_parser_reads_tool_calls_as_trl_does(tiny_chatml_model):
    parser = get_action_parser("tool_calls", AutoTokenizer.from_pretrained(tiny_chatml_model))
    assert json.loads(parser(call("add", n=2))) == [{"name": "add", "arguments": {"n": 2}}]
    two = parser("I add, then look.\n" + call("add", n=1) + "\n" + call("peek"))
    assert json.loads(two) == [{"name": "add", "arguments": {"n": 1}}, {"name": "peek", "arguments": {}}]
    assert parser(MALFORMED) is None and parser("add 2") is None


def test_the_parser_refuses_a_template_without_tools(tiny_llama3_model):
    with pytest.raises(ValueError, match="cannot render tool calls"):
        get_action_parser("tool_calls", AutoTokenizer.from_pretrained(tiny_llama3_model))


def scripted(tokenizer, replies):
    """A generate function that answers every context with the next reply of `replies` (its tokens and eos)."""
    queue = list(replies)

    def generate(contexts, max_new_tokens):
        out = []
        for _ in contexts:
            out.append(tokenizer(queue.pop(0), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
        return out, None

    return generate


def play(tokenizer, replies, **kwargs):
    rules = EpisodeRules(max_turns=4, max_completion_length=200, action_parser="tool_calls",
                         chat_template_kwargs=tool_chat_template_kwargs(CounterTools), **kwargs)
    runner = EpisodeRunner(tool_environment(CounterTools, success_reward=1.0), tokenizer,
                           scripted(tokenizer, replies), rules, env_mode="inline")
    try:
        [episode] = runner([{"prompt": [{"role": "user", "content": "Reach the target."}], "target": 3}])
    finally:
        runner.close()
    return episode


def test_a_tool_call_steps_the_environment_and_a_malformed_one_is_a_format_error(tiny_chatml_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_chatml_model)
    episode = play(tokenizer, [call("add", n=1), MALFORMED, call("nope"), call("add", n=2)])
    assert episode.prompt_messages[-1]["content"] == "Reach the target. The counter is at 0; the target is 3."
    assert episode.format_errors == [False, True, False, False]
    assert episode.observations == ["The counter is at 1.", UNREADABLE_REPLY, "{'error': 'Tool nope not found.'}",
                                    "The counter is at 3."]
    # Per-turn rewards: the growth of get_reward/`reward` in each turn, summing to the final reward (0.5 + 1).
    assert episode.turn_rewards == [0.5, 0.0, 0.0, 1.0]
    assert episode.done and episode.won and not episode.truncated
    # The model was shown its tools in the prompt, by the chat template.
    prompt = tokenizer.decode(episode.prompt_ids)
    assert "<tools>" in prompt and '"name": "add"' in prompt and "how much to add" in prompt


def test_won_comes_from_the_reward_never_from_done(tiny_chatml_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_chatml_model)
    episode = play(tokenizer, [call("add", n=5)])  # overshoots: done, not won
    assert episode.done and not episode.won and episode.turn_rewards == [0.5]


def test_tool_errors_reach_the_model_as_in_trl():
    env = ToolEnvironment(CounterTools)
    env.reset({"target": 1})
    assert env.step(json.dumps([{"name": "add", "arguments": "x"}])).observation.startswith("{'error':")
    assert env.step(json.dumps([{"name": "add", "arguments": {"m": 1}}])).observation.startswith("{'error':")
    result = env.step(json.dumps([{"name": "add", "arguments": {"n": 1}}]))
    assert result.done and result.reward == 1.5 and not result.won  # no success_reward: wins are never guessed


def test_grpo_trains_the_tiny_model_on_a_tool_environment(tiny_chatml_model, tmp_path):
    """The tiny-model example: GRPO on CounterTools through ToolEnvironment, in worker processes."""
    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, max_steps=1, action_parser="tool_calls", format_penalty=0.1,
                        reward_mode="dense", chat_template_kwargs=tool_chat_template_kwargs(CounterTools))
    rows = [{"prompt": [{"role": "user", "content": "Reach the target."}], "target": t} for t in (1, 2, 3, 2)]
    trainer = MultiTurnGRPOTrainer(model=tiny_chatml_model, args=args, train_dataset=Dataset.from_list(rows),
                                   environment_factory=tool_environment(CounterTools, success_reward=1.0))
    out = trainer.train()
    assert trainer.state.global_step == 1 and math.isfinite(out.training_loss)
    [logged] = [log for log in trainer.state.log_history if "episodes/success_rate" in log]
    assert logged["episodes/failed"] == 0


def test_tool_results_reach_the_model_as_tool_messages_token_exactly(tiny_chatml_model):
    """Tool results are `role: "tool"` messages, rendered by the template as tool responses (Qwen2.5's
    `<tool_response>` blocks); the request after an unreadable reply stays a user turn. The episode's tokens are the
    template's own rendering of its conversation."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_chatml_model)
    episode = play(tokenizer, [call("add", n=1), MALFORMED, call("add", n=2)])
    assert episode.observation_roles == ["tool", "user", "tool"]
    messages = episode.messages()
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "user", "assistant", "tool"]
    env_text = tokenizer.decode([t for t, m in zip(episode.completion_ids, episode.env_mask) if not m])
    assert "<tool_response>\nThe counter is at 1.\n</tool_response>" in env_text
    assert f"<|im_start|>user\n{UNREADABLE_REPLY}<|im_end|>" in env_text
    # Token-exact: the ids built turn by turn are the template's rendering of the whole conversation (up to the
    # last reply's end-of-turn token; the final tool result ended the game and was never appended).
    rendered = tokenizer.apply_chat_template(messages[:-1], tokenize=True, return_dict=True,
                                             **tool_chat_template_kwargs(CounterTools))["input_ids"]
    ids = episode.prompt_ids + episode.completion_ids
    assert list(rendered[: len(ids)]) == ids and len(rendered) - len(ids) <= 1  # the template's "\n" after the turn


TEMPLATE_REFUSING_TOOLS = (
    "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('Only user and assistant roles') }}"
    "{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEMPLATE_DROPPING_TOOLS = (
    "{% for m in messages %}{% if m.role != 'tool' %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize("template,why", [(TEMPLATE_REFUSING_TOOLS, "it raises"),
                                          (TEMPLATE_DROPPING_TOOLS, "it leaves the message out")])
def test_a_template_that_cannot_render_tool_messages_is_refused_naming_the_fix(tiny_chatml_model, template, why):
    from trl_multiturn.rollout.chat_tokens import ChatTemplateError

    tokenizer = AutoTokenizer.from_pretrained(tiny_chatml_model)
    tokenizer.chat_template = template
    with pytest.raises(ChatTemplateError, match=f"cannot render 'tool' messages \\({why}.*chat_template_path.*"
                                                "observation_role = \"user\""):
        EpisodeRunner(tool_environment(CounterTools), tokenizer, lambda contexts, n: ([], None),
                      EpisodeRules(max_turns=2, max_completion_length=8), env_mode="inline")
