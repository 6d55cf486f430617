"""Every field of every config class of the package is checked when the config is built (`config_checks`).

The walk is driven by `dataclasses.fields`, so a field added later is covered without touching this file: a numeric
field without a `_RANGES` entry, or a field whose annotation takes any value, fails here unless it is listed in
`FREE_FORM` (or, for a number that may be negative, `SIGNED`) with the reason.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import pkgutil
import re

import pytest

import trl_multiturn
from trl_multiturn.commands.eval import EvalArguments
from trl_multiturn.commands.script_args import (
    EnvArguments,
    ModelArguments,
    StartComparisonArguments,
    TextWorldScriptArguments,
)
from trl_multiturn.commands.study.spec import StudyData, StudyEval
from trl_multiturn.config_checks import field_checks, is_numeric
from trl_multiturn.envs.alfworld.env import ALFWorldConfig
from trl_multiturn.envs.alfworld.generator.generate import ALFWorldGenConfig
from trl_multiturn.envs.openenv import OpenEnvConfig
from trl_multiturn.envs.swegym.env import SWEGymConfig
from trl_multiturn.envs.swegym.sandbox.base import SandboxConfig
from trl_multiturn.envs.textworld.env import TextWorldConfig
from trl_multiturn.model_setup import ModelSetup
from trl_multiturn.rollout.rules import EpisodeRules
from trl_multiturn.trainers.grpo import MultiTurnGRPOConfig
from trl_multiturn.trainers.multiturn import MultiTurnArguments
from trl_multiturn.trainers.ppo import MultiTurnPPOConfig
from trl_multiturn.trainers.rloo import MultiTurnRLOOConfig
from trl_multiturn.trainers.sft import MultiTurnSFTConfig

TRAINER_CONFIGS = (MultiTurnGRPOConfig, MultiTurnRLOOConfig, MultiTurnPPOConfig, MultiTurnSFTConfig)
CONFIG_CLASSES = (*TRAINER_CONFIGS, MultiTurnArguments, ModelSetup, ModelArguments, StartComparisonArguments,
                  TextWorldScriptArguments, EnvArguments, EvalArguments, TextWorldConfig, ALFWorldConfig,
                  ALFWorldGenConfig, SandboxConfig, SWEGymConfig, StudyData, StudyEval, OpenEnvConfig, EpisodeRules)

# Fields that take any value of any type, each with the reason (none today).
FREE_FORM: dict[tuple[str, str], str] = {}
# Numeric fields for which a negative value is meaningful, each with the reason.
SIGNED = {
    "success_reward": "a negative reward for a won episode is a valid (if odd) design; only NaN/inf are refused",
}


def build(cls, **values):
    """`cls` with its defaults and `values` (the trainer configs need an output folder and run on the CPU)."""
    if cls in TRAINER_CONFIGS:
        values = dict(output_dir="unused-output", use_cpu=True, bf16=False, report_to="none", **values)
    return cls(**values)


def checked_fields():
    return [pytest.param(cls, check, id=f"{cls.__name__}.{check.name}")
            for cls in CONFIG_CLASSES for check in field_checks(cls)]


def refuses(cls, name, value):
    """Assert that building `cls` with `name=value` raises an error that names the field."""
    with pytest.raises((ValueError, TypeError)) as caught:
        build(cls, **{name: value})
    assert re.search(rf"\b{re.escape(name)}\b", str(caught.value)), (name, value, str(caught.value))


def test_every_config_class_of_the_package_is_walked():
    """A config dataclass added to the package later is walked too: it must be listed in CONFIG_CLASSES."""
    found = set()
    for module_info in pkgutil.walk_packages(trl_multiturn.__path__, "trl_multiturn."):
        module = importlib.import_module(module_info.name)
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__
                    and (re.search(r"(Config|Arguments|Setup)$", name) or "_RANGES" in vars(obj))):
                found.add(obj)
    assert found == set(CONFIG_CLASSES)


@pytest.mark.parametrize("cls", CONFIG_CLASSES, ids=lambda cls: cls.__name__)
def test_every_default_config_builds(cls):
    config = build(cls)
    assert all(check.problem(getattr(config, check.name)) is None for check in field_checks(cls))


@pytest.mark.parametrize("cls", CONFIG_CLASSES, ids=lambda cls: cls.__name__)
def test_every_field_the_package_declares_is_checked(cls):
    """Each field a class of the package declares has a check (the walk below covers it), and each numeric one a
    range; inherited TRL fields are checked only when named in a `_RANGES` table."""
    own = {name for base in cls.__mro__ if base.__module__.startswith("trl_multiturn.")
           for name in vars(base).get("__annotations__", {}) if not name.startswith("_")}
    checks = {check.name: check for check in field_checks(cls)}
    assert own <= set(checks)
    unranged = [name for name, check in checks.items() if is_numeric(check.annotation) and check.range is None]
    assert not unranged, f"{cls.__name__}: give these numeric fields a _RANGES entry: {unranged}"


# Values of another type than the annotation's, by the first of its types that the field takes (numbers first).
WRONG_TYPE = {int: ["3", 2.5, True], float: ["0.5", True], bool: ["yes", 1], str: [123]}


def members(annotation) -> tuple:
    return getattr(annotation, "__args__", (annotation,))


@pytest.mark.parametrize(("cls", "check"), checked_fields())
def test_a_value_of_the_wrong_type_is_refused_naming_the_field(cls, check):
    if (cls.__name__, check.name) in FREE_FORM:
        pytest.skip(FREE_FORM[(cls.__name__, check.name)])
    kind = next((kind for kind in WRONG_TYPE if kind in members(check.annotation)), None)
    for value in [object(), *WRONG_TYPE.get(kind, [])]:
        refuses(cls, check.name, value)


@pytest.mark.parametrize(("cls", "check"), [p for p in checked_fields() if is_numeric(p.values[1].annotation)])
def test_a_number_that_is_nan_infinite_negative_or_out_of_range_is_refused(cls, check):
    step = 0.5 if float in members(check.annotation) else 1
    for value in (math.nan, math.inf, -math.inf):
        refuses(cls, check.name, value)
    if check.name not in SIGNED:
        refuses(cls, check.name, -step)
    bounds = check.range
    beyond = [bounds.ge - step if bounds.ge is not None else None, bounds.gt,
              bounds.le + step if bounds.le is not None else None, bounds.lt]
    for value in beyond:
        if value is not None:
            refuses(cls, check.name, value if step == 0.5 else int(value))


# The values the issue found accepted (they destroyed the model) or failing late with a raw error naming no field.
ISSUE_CASES = [
    (MultiTurnGRPOConfig, "success_reward", math.nan), (MultiTurnGRPOConfig, "turn_gamma", math.nan),
    (MultiTurnGRPOConfig, "format_penalty", math.nan), (MultiTurnGRPOConfig, "turn_gamma", -0.5),
    (MultiTurnGRPOConfig, "turn_gamma", 5.0), (MultiTurnGRPOConfig, "success_reward", math.inf),
    (MultiTurnGRPOConfig, "max_turns", 2.5), (MultiTurnGRPOConfig, "max_episode_tokens", 2.5),
    (MultiTurnGRPOConfig, "system_prompt", 123), (MultiTurnGRPOConfig, "rollout_overlap", "yes"),
    (MultiTurnGRPOConfig, "max_turns", "3"), (MultiTurnGRPOConfig, "env_timeout", "10"),
    (MultiTurnRLOOConfig, "turn_gamma", math.nan), (MultiTurnSFTConfig, "system_prompt", 123),
    (MultiTurnPPOConfig, "critic_learning_rate", -1e-3), (MultiTurnPPOConfig, "vf_coef", math.nan),
    (MultiTurnPPOConfig, "num_generations", 0), (MultiTurnGRPOConfig, "num_generations", 0),
    (MultiTurnGRPOConfig, "learning_rate", math.nan), (MultiTurnSFTConfig, "learning_rate", -1e-5),
]


@pytest.mark.parametrize(("cls", "name", "value"), ISSUE_CASES, ids=lambda v: getattr(v, "__name__", repr(v)))
def test_the_values_the_issue_found_accepted_are_refused(cls, name, value):
    with pytest.raises(ValueError) as caught:
        build(cls, **{name: value})
    message = str(caught.value)
    assert f"{name}={value!r}" in message and "give " in message, message


def test_the_error_names_the_allowed_values():
    with pytest.raises(ValueError, match=r"MultiTurnGRPOConfig\.turn_gamma=-0\.5: give a number in \[0, 1\]"):
        build(MultiTurnGRPOConfig, turn_gamma=-0.5)
    with pytest.raises(ValueError, match=r"max_turns='3': give an integer >= 1 .*\(got str\)"):
        build(MultiTurnGRPOConfig, max_turns="3")


@pytest.mark.parametrize("estimator", ["grpo", "turn_grpo", "gigpo"])
def test_estimator_options_are_checked_against_the_estimator(estimator):
    with pytest.raises(ValueError, match=r"estimator_kwargs\['gamma'\]='x': give a number in \[0, 1\]"):
        build(MultiTurnGRPOConfig, advantage_estimator=estimator, estimator_kwargs={"gamma": "x"})
    with pytest.raises(ValueError, match=r"estimator_kwargs\['gamma'\]=nan"):
        build(MultiTurnGRPOConfig, advantage_estimator=estimator, estimator_kwargs={"gamma": math.nan})
    assert build(MultiTurnGRPOConfig, advantage_estimator=estimator,
                 estimator_kwargs='{"gamma": 0.9}').estimator_kwargs == {"gamma": 0.9}


def test_well_typed_values_at_the_edges_of_their_ranges_are_accepted():
    config = build(MultiTurnPPOConfig, turn_gamma=1.0, gamma=0.0, lam=1, max_turns=1, max_episode_tokens=1,
                   env_timeout=10, success_reward=-2.0, format_penalty=0, critic_learning_rate=1e-4,
                   learning_rate=0.0, num_generations=1)
    assert (config.turn_gamma, config.env_timeout, config.num_generations, config.learning_rate) == (1.0, 10, 1, 0.0)
    assert build(SandboxConfig, command_timeout=0.5, uid_base=0).command_timeout == 0.5
