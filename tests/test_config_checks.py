"""Bad values are refused when the config or the trainer is built, with an error naming the field and the fix (not
at the first rollout, and not as a raw library exception)."""

import logging

import pytest
from conftest import tiny_rl_args
from datasets import Dataset
from toy_envs import CountingEnv
from transformers import AutoTokenizer

from trl_multiturn import (
    EpisodeRunner,
    MultiTurnGRPOConfig,
    MultiTurnGRPOTrainer,
    MultiTurnPPOConfig,
    MultiTurnRLOOConfig,
)
from trl_multiturn.rollout.rules import EpisodeRules
from trl_multiturn.testing import FaultyEnv


@pytest.mark.parametrize("config_cls", [MultiTurnGRPOConfig, MultiTurnRLOOConfig])
@pytest.mark.parametrize("overrides,message", [
    ({"env_timeout": 0}, r"env_timeout=0: give a number of seconds > 0"),
    ({"env_timeout": -5.0}, r"env_timeout=-5.0: give a number of seconds > 0"),
    ({"env_mode": "inline", "env_timeout": 10}, r"env_timeout needs env_mode"),
    ({"env_mode": "parallel"}, r"env_mode='parallel': choose one of"),
    ({"advantage_estimator": "turn_grop"}, r"advantage_estimator='turn_grop': .*; did you mean 'turn_grpo'\?"),
    ({"env_max_memory_mb": -1}, r"env_max_memory_mb=-1"),
    ({"env_mode": "thread", "env_max_memory_mb": 512}, r"env_max_memory_mb needs worker processes"),
    ({"max_episode_tokens": 0}, r"max_episode_tokens=0: give a positive number"),
    ({"max_completion_length": 0}, r"max_completion_length=0: give a positive number of tokens for one reply"),
    ({"max_completion_length": None}, r"max_completion_length=None: give a positive number of tokens for one reply"),
    ({"action_parser": "no_such_package.parsers:act"}, r"action_parser='no_such_package.parsers:act' cannot be "
                                                       r"loaded \(ModuleNotFoundError"),
    ({"action_parser": "trl_multiturn.rollout.parsing:no_such_parser"}, r"cannot be loaded \(AttributeError"),
    ({"action_parser": "trl_multiturn.rollout.parsing:ACTION_PARSERS"}, r"names a Registry, not a function"),
    ({"estimator_kwargs": '{"step_weight": 0.5'}, r"estimator_kwargs='\{\"step_weight\": 0.5' is not valid JSON"),
    ({"estimator_kwargs": "[0.5]"}, r"estimator_kwargs=\[0.5\]: give a dict"),
    ({"advantage_estimator": "gigpo", "estimator_kwargs": {"stepweight": 0.5}},
     r"estimator_kwargs \['stepweight'\] are not options of advantage_estimator='gigpo'; it takes .*'step_weight'"),
    ({"advantage_estimator": "gigpo", "estimator_kwargs": '{"step_weight": 0.5, "lam": 1}'},
     r"estimator_kwargs \['lam'\] are not options"),
])
def test_a_bad_value_is_refused_at_config_construction(tmp_path, config_cls, overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_rl_args(config_cls, tmp_path, **overrides)


@pytest.mark.parametrize("config_cls, overrides, message", [
    (MultiTurnPPOConfig, {"turn_gamma": 0.9}, r"turn_gamma=0.9 \(PPO discounts with its value estimator's gamma"),
    (MultiTurnPPOConfig, {"estimator_kwargs": '{"lam": 0.9}'},
     r"estimator_kwargs=\{'lam': 0.9\} \(PPO's value estimators take gamma and lam: set those fields\)"),
    (MultiTurnPPOConfig, {"scale_rewards": "none"}, r"scale_rewards='none' \(PPO normalises .* whiten_advantages\)"),
    (MultiTurnPPOConfig, {"multi_objective_aggregation": "normalize_then_sum"}, r"multi_objective_aggregation="),
    (MultiTurnGRPOConfig, {"multi_objective_aggregation": "normalize_then_sum"},
     r"MultiTurnGRPOConfig does not use these fields.*multi_objective_aggregation='normalize_then_sum' \(multi-turn "
     r"credit adds each reward function's weighted score to the final turn's reward"),
    (MultiTurnRLOOConfig, {"reward_clip_range": (-1.0, 1.0)}, r"reward_clip_range=\(-1.0, 1.0\) \(it clips one"),
])
def test_a_field_the_trainer_does_not_use_is_refused_naming_what_to_use(tmp_path, config_cls, overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_rl_args(config_cls, tmp_path, **overrides)


def test_every_unused_field_is_named_in_one_error_and_defaults_pass(tmp_path):
    with pytest.raises(ValueError) as info:
        tiny_rl_args(MultiTurnPPOConfig, tmp_path, turn_gamma=0.5, estimator_kwargs={"lam": 0.9}, scale_rewards=False)
    assert [part.split("=")[0] for part in str(info.value).split(": ", 1)[1].split("; ")] == [
        "turn_gamma", "estimator_kwargs", "scale_rewards"]
    args = tiny_rl_args(MultiTurnPPOConfig, tmp_path, turn_gamma=1.0, estimator_kwargs={}, scale_rewards=True)
    args.turn_gamma = 0.9  # set after construction: refused when a trainer checks the config again
    with pytest.raises(ValueError, match="turn_gamma=0.9"):
        args.check_multiturn_args()


def test_estimator_kwargs_json_is_parsed_into_a_dict(tmp_path):
    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, advantage_estimator="gigpo",
                        estimator_kwargs='{"step_weight": 0.5}')
    assert args.estimator_kwargs == {"step_weight": 0.5}


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

    rules = EpisodeRules(max_turns=2, max_completion_length=4, max_episode_tokens=100)
    runner = EpisodeRunner(FaultyEnv, tokenizer, end_of_turn, rules, env_mode="inline")
    with caplog.at_level(logging.WARNING, logger="trl_multiturn.rollout.runner"):
        episodes = runner([{"fault": "huge_observation"}] * 3 + [{}])
    assert [ep.failed for ep in episodes] == [True, True, True, False]
    assert "3 of 4 episodes failed before their first reply" in caplog.text and "max_episode_tokens=100" in caplog.text


@pytest.mark.parametrize("trainer_cls", ["MultiTurnGRPOTrainer", "MultiTurnRLOOTrainer"])
@pytest.mark.parametrize("train_rows,eval_rows,message", [
    ([{"target": 1, "completions": "x"}] * 4, None,
     r"train_dataset has the columns \['completions'\], names the trainer gives its reward functions itself; "
     r"rename them"),
    ([{"target": 1, "trainer_state": 0, "won": 1}] * 4, None, r"columns \['trainer_state', 'won'\]"),
    ([], None, r"train_dataset is empty \(0 rows\)"),
    ([{"target": 1}] * 4, [], r"eval_dataset is empty \(0 rows\)"),
])
def test_a_dataset_that_is_empty_or_uses_a_reserved_column_is_refused_at_construction(
        tiny_chatml_model, tmp_path, trainer_cls, train_rows, eval_rows, message):
    import trl_multiturn

    config_cls = MultiTurnRLOOConfig if trainer_cls == "MultiTurnRLOOTrainer" else MultiTurnGRPOConfig
    args = tiny_rl_args(config_cls, tmp_path, eval_strategy="no")
    train = Dataset.from_list(train_rows) if train_rows else Dataset.from_dict({"target": []})
    evaluation = None if eval_rows is None else Dataset.from_dict({"target": []})
    with pytest.raises(ValueError, match=message):
        getattr(trl_multiturn, trainer_cls)(model=tiny_chatml_model, args=args, environment_factory=CountingEnv,
                                            train_dataset=train, eval_dataset=evaluation)
