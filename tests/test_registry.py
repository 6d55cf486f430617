"""`Registry`, the one registry type behind advantage estimators, value estimators and action parsers."""

import pytest

from trl_multiturn.credit import ESTIMATORS, get_estimator
from trl_multiturn.credit.gae import VALUE_ESTIMATORS, get_value_estimator
from trl_multiturn.registry import Registry
from trl_multiturn.rollout.parsing import ACTION_PARSERS, first_line, get_action_parser


def test_register_adds_by_decorator_and_lookup_names_every_choice():
    registry = Registry("my_field")

    @registry.register("double")
    def double(x):
        return 2 * x

    @registry.register("half")
    def half(x):
        return x / 2

    assert double(3) == 6  # the decorator returns the function unchanged
    assert registry.lookup("double") is double and registry["half"] is half
    assert sorted(registry) == ["double", "half"] and len(registry) == 2 and "half" in registry
    with pytest.raises(ValueError, match=r"my_field='triple': choose one of \['double', 'half'\]$"):
        registry.lookup("triple")  # nothing close: no suggestion
    with pytest.raises(ValueError, match=r"my_field='dubble': .*; did you mean 'double'\?"):
        registry.lookup("dubble")


def test_a_taken_name_is_refused_and_the_first_entry_kept():
    registry = Registry("my_field")
    registry.register("a")(len)
    with pytest.raises(ValueError, match="'a' is already registered"):
        registry.register("a")(str)
    assert registry.lookup("a") is len


def test_estimators_value_estimators_and_parsers_share_the_registry_type():
    for registry in (ESTIMATORS, VALUE_ESTIMATORS, ACTION_PARSERS):
        assert isinstance(registry, Registry)
    assert {"grpo", "rloo", "gigpo"} <= set(ESTIMATORS) and {"gae", "turn_gae"} <= set(VALUE_ESTIMATORS)
    assert get_estimator("grpo") is ESTIMATORS["grpo"] and get_value_estimator("gae") is VALUE_ESTIMATORS["gae"]
    assert get_action_parser("first_line") is first_line
    with pytest.raises(ValueError, match=r"advantage_estimator='gae': choose one of .*'grpo'"):
        get_estimator("gae")
    with pytest.raises(ValueError, match=r"advantage_estimator='grpo': a trainer with a critic takes one of \['gae'"):
        get_value_estimator("grpo")
