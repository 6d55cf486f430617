"""`EpisodeRules`: every rule of play is declared once, travels whole from the trainer config to the saved model,
and a trained model's evaluation plays by the rules its training played by."""

import dataclasses

import pytest
from conftest import tiny_rl_args
from datasets import Dataset
from toy_envs import HugeObservationEnv

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer, MultiTurnRLOOConfig
from trl_multiturn.commands.eval import EvalArguments, played_rules
from trl_multiturn.episode_settings import load_episode_settings, saved_rules
from trl_multiturn.evaluation import evaluate
from trl_multiturn.rollout.episode import Status
from trl_multiturn.rollout.rules import RULES, EpisodeRules


def count(reply: str) -> str:
    """Every reply counts (a random tiny model rarely writes a clean first line)."""
    return "count"


def lose(reply: str) -> str:
    return "lose"


COUNT_TOOL = {"type": "function", "function": {"name": "count", "description": "Count one up.",
                                               "parameters": {"type": "object", "properties": {}}}}
ROWS = [{"target": 3, "huge_bytes": 1500}, {"target": 3, "huge_bytes": None}]
"""Won at turn 3; the first task's first step answers with a 300-word observation."""
BASE = {"max_turns": 4, "max_completion_length": 8, "action_parser": f"{__name__}:count"}
"""The rules every run below starts from (the others at their defaults)."""
VARIATIONS = {
    "max_turns": {"max_turns": 2},
    "max_completion_length": {"max_completion_length": 3},
    "max_episode_tokens": {"max_episode_tokens": 200},
    "max_observation_tokens": {"max_observation_tokens": 40},
    "system_prompt": {"system_prompt": "You count."},
    "action_parser": {"action_parser": f"{__name__}:lose"},
    "chat_template_kwargs": {"chat_template_kwargs": {"tools": [COUNT_TOOL]}},
    "episode_format": {"episode_format": "stepwise"},
    "history": {"episode_format": "stepwise", "history": "window:1"},
}
"""Per rule, the changes that give it a value other than its default and BASE's (with what it needs: a history
policy needs the step-wise format)."""


def played(ep) -> tuple:
    """What makes two episodes the same: tokens, masks, turns, actions, rewards, status and why they were cut."""
    return (ep.prompt_ids, ep.completion_ids, ep.env_mask, ep.step_contexts, ep.actions, ep.turn_rewards, ep.status,
            [info.get("truncation") for info in ep.infos])


def test_every_rule_has_a_variation_other_than_its_default():
    defaults = EpisodeRules()
    assert list(VARIATIONS) == list(RULES) == [f.name for f in dataclasses.fields(EpisodeRules)]
    for rule, changes in VARIATIONS.items():
        assert changes[rule] != getattr(defaults, rule) and changes[rule] != BASE.get(rule, getattr(defaults, rule))


@pytest.mark.parametrize("rule", RULES)
def test_a_trained_model_and_its_evaluation_play_the_same_episodes_under_each_rule(rule, tiny_chatml_model, tmp_path):
    """One training step (learning rate 0, so the weights stay those the rollout played with; a temperature so low
    that sampling is greedy) under BASE with one rule changed; the saved model's evaluation, by the rules read back
    from its folder, plays every task exactly as the training rollout did. Played by the same rules without the
    change, the episodes differ: the rule was carried, not only left at a value that does not matter."""
    config = tiny_rl_args(MultiTurnGRPOConfig, tmp_path / "run", **{**BASE, **VARIATIONS[rule]}, max_steps=1,
                          learning_rate=0.0, temperature=1e-6, num_generations=2, per_device_train_batch_size=4)
    trainer = MultiTurnGRPOTrainer(model=tiny_chatml_model, args=config, environment_factory=HugeObservationEnv,
                                   train_dataset=Dataset.from_list(ROWS))
    trainer.train()
    trained = {json_key(ep.task): played(ep) for ep in trainer.last_rollout.episodes}
    assert len(trained) == len(ROWS) and len(trainer.last_rollout.episodes) == 2 * len(ROWS)
    folder = tmp_path / "saved"
    trainer.save_model(str(folder))

    rules = saved_rules(folder)
    assert rules == config.episode_rules() and getattr(rules, rule) == VARIATIONS[rule][rule]
    result = evaluate(str(folder), None, ROWS, progress=False, env_mode="inline")  # the saved rules, whole
    assert {json_key(ep.task): played(ep) for ep in result.episodes} == trained
    without = dataclasses.replace(rules, **{rule: BASE.get(rule, getattr(EpisodeRules(), rule))})
    other = evaluate(str(folder), None, ROWS, rules=without, progress=False, env_mode="inline")
    assert {json_key(ep.task): played(ep) for ep in other.episodes} != trained


def json_key(task: dict) -> str:
    return str(sorted(task.items()))


def test_a_trained_observation_cap_holds_in_evaluation(tiny_chatml_model, tmp_path):
    """A model trained with max_observation_tokens=40 is evaluated under the same cap: the huge-observation episode
    ends at turn 1 in evaluation as in training, where without the cap it would play on to turn 3."""
    config = tiny_rl_args(MultiTurnGRPOConfig, tmp_path / "run", **BASE, max_observation_tokens=40)
    trainer = MultiTurnGRPOTrainer(model=tiny_chatml_model, args=config, environment_factory=HugeObservationEnv,
                                   train_dataset=Dataset.from_list(ROWS))
    trainer.save_model(str(tmp_path / "saved"))
    assert load_episode_settings(tmp_path / "saved")["max_observation_tokens"] == 40
    [huge, plain] = evaluate(str(tmp_path / "saved"), None, ROWS, progress=False, env_mode="inline").episodes
    assert huge.num_turns == 1 and huge.status is Status.TRUNCATED
    assert "exceeds max_observation_tokens=40" in huge.infos[-1]["truncation"]
    assert plain.num_turns == 3 and plain.status is Status.WON


def test_the_rl_configs_take_their_rule_fields_from_the_rules():
    """Default, help and choices of every rule a config declares itself are the rules'; TRL's two are TRL's."""
    rules = {f.name: f for f in dataclasses.fields(EpisodeRules)}
    for config_cls in (MultiTurnGRPOConfig, MultiTurnRLOOConfig):
        fields = {f.name: f for f in dataclasses.fields(config_cls)}
        assert set(rules) <= set(fields)
        for name in set(rules) - {"max_completion_length", "chat_template_kwargs"}:
            assert fields[name].default == rules[name].default
            assert fields[name].metadata["help"] == rules[name].metadata["help"]
            assert fields[name].metadata.get("choices") == rules[name].metadata.get("choices")
            assert fields[name].metadata.get("range") == rules[name].metadata.get("range")
            assert "range" not in dict(fields[name].metadata)  # what HfArgumentParser hands argparse


@pytest.mark.parametrize(("changes", "message"), [
    ({"max_turns": 0}, r"max_turns=0: give an integer >= 1"),
    ({"max_observation_tokens": 0}, r"max_observation_tokens=0: give a positive number of tokens"),
    ({"episode_format": "steps"}, r"episode_format='steps': give one of \('trajectory', 'stepwise'\)"),
    ({"history": "window:2"}, r"history='window:2' only applies to episode_format='stepwise'"),
    ({"episode_format": "stepwise", "history": "window:0"}, r"history='window:0'"),
    ({"action_parser": "nope"}, r"action_parser='nope'"),
    ({"chat_template_kwargs": "{not json"}, r"chat_template_kwargs='\{not json' is not valid JSON"),
])
def test_a_bad_rule_is_refused_by_the_rules_and_by_the_config_naming_it(tmp_path, changes, message):
    with pytest.raises(ValueError, match=message):
        EpisodeRules(**changes)
    if "chat_template_kwargs" in changes:
        return  # TRL's field: TRL's config parses its JSON first
    with pytest.raises(ValueError, match=message):
        MultiTurnGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **changes)


def test_rules_round_trip_through_json_and_a_function_is_saved_as_its_path():
    rules = EpisodeRules(max_turns=3, chat_template_kwargs='{"enable_thinking": false}', action_parser=count,
                         episode_format="stepwise", history="window:2")
    assert rules.chat_template_kwargs == {"enable_thinking": False}
    saved = rules.to_dict()
    assert saved["action_parser"] == f"{__name__}:count" and list(saved) == list(RULES)
    assert EpisodeRules.from_dict(saved) == dataclasses.replace(rules, action_parser=f"{__name__}:count")


def test_eval_arguments_override_each_saved_rule_and_leave_the_others(capsys):
    """`trl-multiturn eval` has an optional argument per rule (None: as saved); the ones given replace the saved
    rules and are printed when they differ."""
    saved = {**EpisodeRules(max_turns=5, system_prompt="You count.").to_dict(), "environment": None}
    arguments = EvalArguments(max_observation_tokens=40)
    assert {f.name for f in dataclasses.fields(EvalArguments)} >= set(RULES)
    rules = played_rules(saved, arguments, eval_max_turns=2)
    assert rules == EpisodeRules(max_turns=2, system_prompt="You count.", max_observation_tokens=40)
    assert "max_observation_tokens=40 differs" in capsys.readouterr().out
    assert played_rules(saved, EvalArguments()) == EpisodeRules.from_dict(saved)
