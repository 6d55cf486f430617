"""Every field of every config class of the package is checked when the config is built (`config_checks`).

The walk is driven by `dataclasses.fields`, so a field added later is covered without touching this file: a numeric
field declared without a range (`config_field(..., range=Range(...))`), or a field whose annotation takes any value,
fails here unless it is listed in `FREE_FORM` (or, for a number that may be negative, `SIGNED`) with the reason.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import math
import pkgutil
import re
from typing import Any

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
from trl_multiturn.config_checks import Range, check_fields, config_field, field_checks, is_numeric
from trl_multiturn.envs.alfworld.env import ALFWorldConfig
from trl_multiturn.envs.alfworld.generator.generate import ALFWorldGenConfig
from trl_multiturn.envs.openenv import OpenEnvConfig
from trl_multiturn.envs.swegym.env import SWEGymConfig
from trl_multiturn.envs.swegym.sandbox.base import SandboxConfig
from trl_multiturn.envs.textworld.env import TextWorldConfig
from trl_multiturn.model_setup import ModelSetup
from trl_multiturn.rollout.rules import RULES, EpisodeRules
from trl_multiturn.trainers.dagger import MultiTurnDAggerConfig
from trl_multiturn.trainers.grpo import MultiTurnGRPOConfig
from trl_multiturn.trainers.multiturn import MultiTurnArguments
from trl_multiturn.trainers.ppo import MultiTurnPPOConfig
from trl_multiturn.trainers.rloo import MultiTurnRLOOConfig
from trl_multiturn.trainers.sft import MultiTurnSFTConfig

TRAINER_CONFIGS = (MultiTurnGRPOConfig, MultiTurnRLOOConfig, MultiTurnPPOConfig, MultiTurnSFTConfig,
                   MultiTurnDAggerConfig)
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


def refused(cls, name, value) -> str | None:
    """None when building `cls` with `name=value` raises an error naming the field, else what went wrong."""
    try:
        build(cls, **{name: value})
    except Exception as error:  # noqa: BLE001 - any other error is reported, with every other failing field
        if isinstance(error, (ValueError, TypeError)) and re.search(rf"\b{re.escape(name)}\b", str(error)):
            return None
        return f"{cls.__name__}.{name}={value!r}: {type(error).__name__} not naming the field: {error}"
    return f"{cls.__name__}.{name}={value!r} was accepted"


def test_every_config_class_of_the_package_is_walked():
    """A config dataclass added to the package later is walked too: it must be listed in CONFIG_CLASSES."""
    found = set()
    for module_info in pkgutil.walk_packages(trl_multiturn.__path__, "trl_multiturn."):
        module = importlib.import_module(module_info.name)
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__
                    and (re.search(r"(Config|Arguments|Setup)$", name)
                         or any("range" in f.metadata for f in dataclasses.fields(obj)))):
                found.add(obj)
    assert found == set(CONFIG_CLASSES)


@pytest.mark.parametrize("cls", CONFIG_CLASSES, ids=lambda cls: cls.__name__)
def test_every_default_config_builds(cls):
    config = build(cls)  # inherited fields are checked as given: the parent's __post_init__ may convert them
    checks = [check for check in field_checks(cls) if not check.inherited]
    assert all(check.problem(getattr(config, check.name)) is None for check in checks)


@pytest.mark.parametrize("cls", CONFIG_CLASSES, ids=lambda cls: cls.__name__)
def test_every_field_is_checked_and_every_numeric_field_the_package_declares_has_a_range(cls):
    """Each field of the class, inherited ones too, has a check (the walk below covers it; an inherited field that
    takes no number is its parent's to check); each numeric one a class of the package declares has a range
    (inherited ones: `INHERITED_RANGES` where their meaning gives one, else any finite number)."""
    own = {name for base in cls.__mro__ if base.__module__.startswith("trl_multiturn.")
           for name in vars(base).get("__annotations__", {}) if not name.startswith("_")}
    checks = {check.name: check for check in field_checks(cls)}
    assert set(checks) == {f.name for f in dataclasses.fields(cls)} and own <= set(checks)
    unranged = [name for name, check in checks.items() if name in own and is_numeric(check.annotation)
                and check.range is None]
    assert not unranged, f"{cls.__name__}: declare these numeric fields with config_field(..., range=...): {unranged}"


# Values of another type than the annotation's, by the first of its types that the field takes (numbers first).
WRONG_TYPE = {int: ["3", 2.5, True], float: ["0.5", True], bool: ["yes", 1], str: [123]}


def members(annotation) -> tuple:
    return getattr(annotation, "__args__", (annotation,))


def wrong_values(annotation) -> list:
    """Values whose type none of the annotation's members names (an int is a float; a bool is neither)."""
    types_ = members(annotation)
    if Any in types_:
        return []
    kind = next((kind for kind in WRONG_TYPE if kind in types_), None)
    taken = set(types_) | ({int} if float in types_ else set())
    return [object(), *(v for v in WRONG_TYPE.get(kind, []) if type(v) not in taken)]


def bad_numbers(check) -> list:
    """NaN, infinities, a negative number (unless the field is signed) and the numbers just past its range."""
    step = 0.5 if float in members(check.annotation) else 1
    values = [math.nan, math.inf, -math.inf]
    bounds = check.range
    if bounds is None:
        return values
    if check.name not in SIGNED and not check.inherited:
        values.append(-step)
    beyond = [bounds.ge - step if bounds.ge is not None else None, bounds.gt,
              bounds.le + step if bounds.le is not None else None, bounds.lt]
    return values + [v if step == 0.5 else int(v) for v in beyond if v is not None]


@pytest.mark.parametrize("cls", CONFIG_CLASSES, ids=lambda cls: cls.__name__)
def test_every_field_refuses_wrong_types_nan_infinities_and_values_out_of_its_range(cls):
    """The whole dataclass, inherited TRL and transformers fields included (`max_grad_norm`, `weight_decay`, SFT's
    `max_length` and `num_train_epochs` refuse NaN and inf too); every failing field is reported."""
    failures, tried = [], 0
    for check in field_checks(cls):
        if (cls.__name__, check.name) in FREE_FORM:
            continue
        values = wrong_values(check.annotation) + (bad_numbers(check) if is_numeric(check.annotation) else [])
        tried += len(values)
        failures += [f for value in values if (f := refused(cls, check.name, value))]
    assert tried and not failures, "\n".join(failures)


# Values that, accepted, would destroy the model or fail late with a raw error naming no field: each is refused
# when the config is built, naming its field.
HARMFUL_VALUES = [
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
    *((cls, name, value) for cls in TRAINER_CONFIGS for name in ("max_grad_norm", "weight_decay")
      for value in (math.nan, math.inf)),
    (MultiTurnSFTConfig, "max_length", math.nan), (MultiTurnSFTConfig, "num_train_epochs", math.inf),
    (MultiTurnGRPOConfig, "warmup_steps", math.nan), (MultiTurnRLOOConfig, "adam_beta1", 1.5),
    (MultiTurnPPOConfig, "adam_epsilon", -math.inf), (MultiTurnGRPOConfig, "logging_steps", "10"),
    (MultiTurnSFTConfig, "max_grad_norm", "1.0"), (MultiTurnGRPOConfig, "temperature", 0.0),
]


def test_harmful_values_are_refused_naming_field_value_and_fix():
    failures = []
    for cls, name, value in HARMFUL_VALUES:
        try:
            build(cls, **{name: value})
            failures.append(f"{cls.__name__}.{name}={value!r} was accepted")
        except ValueError as error:
            if f"{name}={value!r}" not in str(error) or "give " not in str(error):
                failures.append(f"{cls.__name__}.{name}={value!r}: {error}")
    assert not failures, "\n".join(failures)


def test_the_error_names_the_allowed_values():
    with pytest.raises(ValueError, match=r"MultiTurnGRPOConfig\.turn_gamma=-0\.5: give a number in \[0, 1\]"):
        build(MultiTurnGRPOConfig, turn_gamma=-0.5)
    with pytest.raises(ValueError, match=r"max_turns='3': give an integer >= 1 .*\(got str\)"):
        build(MultiTurnGRPOConfig, max_turns="3")
    with pytest.raises(ValueError, match=r"MultiTurnSFTConfig\.max_grad_norm=nan: give a number >= 0 \(0 turns"):
        build(MultiTurnSFTConfig, max_grad_norm=math.nan)


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


def test_a_range_declared_beside_the_help_is_checked_and_never_reaches_argparse():
    """`config_field` keeps the range in the field's metadata, where `check_fields` reads it, while
    `HfArgumentParser` (which hands `dict(field.metadata)` to argparse) sees only the help: the command line parses
    and the range is still enforced."""
    from transformers import HfArgumentParser
    from trl import TrlParser

    @dataclasses.dataclass
    class Settings:
        turns: int = config_field(8, "Turns per episode.", range=Range(ge=1))

        def __post_init__(self):
            check_fields(self)

    (turns,) = dataclasses.fields(Settings)
    assert turns.metadata["range"] == Range(ge=1) and dict(turns.metadata) == {"help": "Turns per episode."}
    assert turns.metadata.copy() == {"help": "Turns per episode."}
    for parser in (HfArgumentParser, TrlParser):
        (parsed,) = parser(Settings).parse_args_into_dataclasses(["--turns", "3"])
        assert parsed.turns == 3
        with pytest.raises(ValueError, match=r"Settings\.turns=0: give an integer >= 1"):
            parser(Settings).parse_args_into_dataclasses(["--turns", "0"])


# The classes whose docstring documents their fields as TRL's configs do: a `Parameters:` section, the fields in
# groups under `> Parameters that control ...` headings, each `name (`type`, defaults to `value`):` or
# `name (`type`, *optional*):` (default None), in the order the class declares them.
DOCUMENTED = (MultiTurnArguments, MultiTurnGRPOConfig, MultiTurnRLOOConfig, MultiTurnPPOConfig, MultiTurnSFTConfig,
              MultiTurnDAggerConfig, TextWorldConfig, ALFWorldConfig, SandboxConfig, SWEGymConfig, OpenEnvConfig)
PARAMETER = re.compile(r"(\w+) \(`[^`]+`(, \*optional\*)?(?:, defaults to `(.+)`)?\):")


def documented_parameters(cls) -> list[tuple[str, bool, str | None]]:
    """(name, *optional*, stated default) of each entry of the `Parameters:` section of `cls`'s docstring, in order;
    an AssertionError for an entry before the first group heading or a line at an entry's indentation that is
    neither an entry nor a heading."""
    lines = inspect.cleandoc(cls.__doc__ or "").splitlines()
    assert "Parameters:" in lines, f"{cls.__name__}'s docstring has no Parameters: section"
    entries, heading = [], None
    for line in lines[lines.index("Parameters:") + 1:]:
        if line and not line.startswith(" "):
            break
        if not line.startswith("    ") or line.startswith("     "):
            continue  # a blank line, or an entry's description
        text = line.strip()
        if text.startswith("> "):
            heading = text
            continue
        match = PARAMETER.fullmatch(text)
        assert match and heading, f"{cls.__name__}: {text!r} is not an entry under a `> Parameters ...` heading"
        entries.append((match[1], bool(match[2]), match[3]))
    return entries


@pytest.mark.parametrize("cls", DOCUMENTED, ids=lambda cls: cls.__name__)
def test_the_docstring_documents_every_field_the_class_declares_in_its_groups_with_its_default(cls):
    """The docstring's `Parameters:` names each field the class itself declares (those `rule_fields` adds too),
    nothing else, in declaration order (so the class body follows the groups), with the field's default."""
    declared = [name for name in vars(cls).get("__annotations__", {}) if not name.startswith("_")]
    entries = documented_parameters(cls)
    assert [name for name, _, _ in entries] == declared, (
        f"{cls.__name__}: document exactly its fields, in the order the class declares them")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    wrong = []
    for name, optional, stated in entries:
        f = fields[name]
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        if default is None:
            if not optional or stated is not None:
                wrong.append(f"{name}: default None, write `*optional*` and no default")
        elif stated is None or ast.literal_eval(stated) != default:
            wrong.append(f"{name}: write `defaults to `{default!r}``")
    assert not wrong, f"{cls.__name__}: " + "; ".join(wrong)


# Fields of one name that several config classes declare with different defaults, help or ranges, each with the
# reason (besides `EvalArguments`' rule overrides, `rule_overrides`: None keeps the rule saved with the model).
DIFFERENT = {
    "advantage_estimator": "each trainer's own default estimator (grpo, rloo, PPO's gae)",
    "max_turns": "StudyEval.max_turns is the held-out episodes' override (TextWorldScriptArguments.eval_max_turns's "
                 "declaration, named in the study's `eval:` section)",
    "model_name_or_path": "ModelSetup's is TRL's ModelConfig field, not parsed (init=False)",
    "env": "the commands' default is the saved model's environment; a study's is textworld",
    "task_types": "the commands' apply to training and held-out games, the study's to training (eval_task_types)",
    "tiers": "the commands' apply to training and held-out tasks, the study's to training (eval_tiers)",
    "admissible_commands": "one per environment config and command (each environment's own setting)",
    "data_path": "one per environment config and command (each environment's own setting)",
    "games_dir": "one per environment config and command (each environment's own setting)",
}


def test_a_field_several_classes_declare_has_one_declaration():
    """A field name declared by several config classes has one default, help and range (the others take it:
    `field_like`, `rule_fields`), unless `DIFFERENT` gives the reason."""
    declarations: dict[str, dict[tuple, list[str]]] = {}
    for cls in CONFIG_CLASSES:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name in vars(cls).get("__annotations__", {}):
            if name.startswith("_") or (cls is EvalArguments and name in RULES):
                continue
            f = fields[name]
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            key = (repr(default), f.metadata.get("help"), f.metadata.get("range"))
            declarations.setdefault(name, {}).setdefault(key, []).append(cls.__name__)
    differing = {name: sorted(c for classes in found.values() for c in classes)
                 for name, found in declarations.items() if len(found) > 1}
    assert set(differing) <= set(DIFFERENT), {name: differing[name] for name in set(differing) - set(DIFFERENT)}
    assert set(DIFFERENT) <= set(differing), f"remove from DIFFERENT: {set(DIFFERENT) - set(differing)}"


def test_the_sft_config_checks_its_rules_of_play_as_the_rl_configs_do():
    """SFT's rule fields are `EpisodeRules`' (`rule_fields`), checked when the config is built, as RL's are."""
    for cls in (MultiTurnSFTConfig, MultiTurnGRPOConfig):
        with pytest.raises(ValueError, match=r"action_parser='nope' is not a known parser"):
            build(cls, action_parser="nope")
    assert build(MultiTurnSFTConfig, chat_template_kwargs='{"enable_thinking": false}').chat_template_kwargs == {
        "enable_thinking": False}
