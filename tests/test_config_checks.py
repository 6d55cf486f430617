"""Bad values are refused when the config or the trainer is built, with an error naming the field and the fix (not
at the first rollout, and not as a raw library exception)."""

import logging

import pytest
from conftest import tiny_rl_args
from datasets import Dataset
from toy_envs import CountingEnv
from transformers import AutoTokenizer

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer, MultiTurnRolloutCollator
from trl_multiturn.testing import FaultyEnv


def test_an_episode_budget_smaller_than_any_prompt_is_refused_at_construction(tiny_chatml_model, tmp_path):
    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, max_episode_tokens=6, system_prompt="You play a text game.")
    with pytest.raises(ValueError, match=r"max_episode_tokens=6 is smaller than any episode can be: the chat "
                                         r"template and system prompt alone take \d+ tokens"):
        MultiTurnGRPOTrainer(model=tiny_chatml_model, args=args, environment_factory=CountingEnv,
                             train_dataset=Dataset.from_list([{"target": 1}] * 4))


def test_a_warning_when_most_episodes_fail_before_their_first_reply(tiny_chatml_model, caplog):
    tokenizer = AutoTokenizer.from_pretrained(tiny_chatml_model)

    def end_of_turn(contexts, max_new_tokens):
        return [[tokenizer.eos_token_id] for _ in contexts], None

    collator = MultiTurnRolloutCollator(FaultyEnv, tokenizer, end_of_turn, max_turns=2, max_reply_tokens=4,
                                        max_episode_tokens=100, env_mode="inline")
    with caplog.at_level(logging.WARNING, logger="trl_multiturn.rollout.collator"):
        episodes = collator([{"fault": "huge_observation"}] * 3 + [{}])
    assert [ep.failed for ep in episodes] == [True, True, True, False]
    assert "3 of 4 episodes failed before their first reply" in caplog.text and "max_episode_tokens=100" in caplog.text
