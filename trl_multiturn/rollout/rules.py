"""`EpisodeRules`: every rule that decides how an episode is played, declared once.

A rule is what the environment or the model sees: how many replies an episode has, how long a reply, an
observation and the whole conversation may be, the system message, how an action is read from a reply, the chat
template's extra arguments and what each turn's context holds (the episode format and its history policy). The
same rules must hold in training and in every later play of the model, so they travel as one object:

    trainer config --EpisodeRules.from_config--> EpisodeRunner (training)
                   --episode_settings.json-----> evaluate / trl-multiturn eval, play, study --> EpisodeRunner

Each rule is one field below, its default, help, range and choices in its own metadata (`rule`). The multi-turn
trainer configs take their fields from here (`rule_fields`, on `MultiTurnArguments`) and `trl-multiturn eval` its
overrides (`rule_overrides`), so adding a rule is one field here, read by the runner (and its tests).

Not rules (how a run is executed, which leaves the episodes played unchanged): where and how environments run
(`env_mode`, timeouts, memory limits, Ray placement), the rollout schedule and overlap, the generation backend and
its cache, the batch size. Nor how the played episodes are scored for training (reward mode, estimator) or sampled
(temperature: evaluation is greedy by default). The chat template itself is saved with the tokenizer, and the
environment (what it is and its settings) beside the rules in `episode_settings.json`.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

from ..config_checks import Range, check_fields, config_field, field_like, parse_json_dict
from .formats import FORMATS, EpisodeFormat, episode_format
from .parsing import get_action_parser

EPISODE_FORMATS = tuple(FORMATS)
TRL_FIELD = "trl_field"
"""Metadata key of a rule that TRL's RL configs already declare (`max_completion_length`, `chat_template_kwargs`):
the rule takes TRL's name, and a trainer config keeps TRL's field (and its default) for it."""


def rule(default, help: str, *, range: Range | None = None, choices: tuple | None = None, trl: bool = False):
    """A rule's field: its default, its help, and (for a number) its range, (for a string) its choices."""
    return config_field(default, help, range=range, choices=choices, **({TRL_FIELD: True} if trl else {}))


@dataclass(frozen=True)
class EpisodeRules:
    """The rules an episode is played by (see the module docstring for what is one and what is not).

    `EpisodeRules.from_config(args)` takes them from a trainer config, `to_dict`/`from_dict` write and read them
    (`episode_settings.json`), and `dataclasses.replace(rules, max_turns=4)` changes one. Every value is checked
    when the object is built: a ValueError names the field, the value and what to give.
    """

    max_turns: int = rule(8, "The most replies the model makes in one episode.",
                          range=Range(ge=1, text="an integer >= 1 (an episode needs at least one turn)"))
    max_completion_length: int = rule(
        32, "Cap on one reply's tokens (TRL's field of the same name in the trainer configs, with TRL's default "
            "there). A reply cut at it is closed with the template's end-of-turn token and the episode goes on.",
        range=Range(ge=1, text="a positive number of tokens for one reply (an integer, e.g. 64)"), trl=True)
    max_episode_tokens: int | None = rule(
        None, "Cap on a whole episode's tokens (prompt, replies and observations). An episode that would exceed it "
              "ends as truncated. `max_completion_length` caps one reply.",
        range=Range(ge=1, text="a positive number of tokens for the whole episode (an integer), or None for no cap"))
    max_observation_tokens: int | None = rule(
        8192, "Cap on one observation's tokens. A later observation longer than this ends its episode as truncated "
              "(its last info's 'truncation' says why); a longer first observation fails the episode. Without it, "
              "one huge observation (a 1 MB file listing) would go whole through every forward pass. None for no "
              "cap.",
        range=Range(ge=1, text="a positive number of tokens for one observation (an integer), or None for no cap"))
    system_prompt: str | None = rule(None, "Optional system message placed before the first observation.")
    action_parser: str | Callable = rule(
        "first_line", "How an action is read from a reply: 'first_line', 'think_then_act', 'whole_reply', "
                      "'tool_calls' (the reply's tool calls, read with TRL's response parsing, for "
                      "`trl_multiturn.envs.tools.ToolEnvironment`), or a 'package.module:function' path (in Python, "
                      "also a function reply -> action or None; it is saved as its path).")
    chat_template_kwargs: dict | None = rule(
        None, "Extra keyword arguments for `apply_chat_template` (e.g. `enable_thinking`, or `tools`); a JSON "
              "object on the command line.", trl=True)
    episode_format: str = rule(
        "trajectory", "How an episode becomes training data, and so what each turn's context holds. 'trajectory': "
                      "one growing token sequence per episode (observations appended as template deltas), trained "
                      "as one sample. 'stepwise': each turn's context is rendered whole by the chat template from "
                      "the `history` policy's view of the episode, and each turn is its own sample (context as the "
                      "model saw it, reply as sampled), with the estimator's advantage for that turn (PPO: GAE "
                      "across the episode's steps, the critic valuing each step's context). See docs/stepwise.md.",
        choices=EPISODE_FORMATS)
    history: str | Callable = rule(
        "full", "episode_format='stepwise': what each turn's context holds besides the opening messages: 'full' "
                "(every turn so far), 'window:K' (the last K turns verbatim), or a 'package.module:function' path "
                "to a policy `(opening, turns) -> messages` (`trl_multiturn.rollout.history`; in Python, also the "
                "policy itself, saved as its path).")

    def __post_init__(self):
        object.__setattr__(self, "chat_template_kwargs",
                           parse_json_dict("chat_template_kwargs", self.chat_template_kwargs, '{"enable_thinking": '
                                                                                              'false}'))
        check_fields(self)
        get_action_parser(self.action_parser)
        self.episode_format_strategy()

    @classmethod
    def from_config(cls, config) -> EpisodeRules:
        """The rules of a trainer config: each rule the config has a field for (an SFT config has some), the
        default for the others."""
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls) if hasattr(config, f.name)})

    def to_dict(self) -> dict:
        """Every rule by name, as JSON data (a function, as `action_parser` or `history`, by its 'module:function'
        path)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {name: f"{value.__module__}:{value.__qualname__}" if callable(value) else value
                for name, value in values.items()}

    @classmethod
    def from_dict(cls, values: dict) -> EpisodeRules:
        """The rules `to_dict` wrote (other keys are left to the caller); a rule missing from `values` gets its
        default."""
        return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values})

    def episode_format_strategy(self) -> EpisodeFormat:
        """The episode format these rules play and train by (`trl_multiturn.rollout.formats`: `Trajectory`, or
        `StepWise` with the `history` policy), the one place `episode_format` and `history` are read."""
        return episode_format(self.episode_format, self.history)

RULES = tuple(f.name for f in dataclasses.fields(EpisodeRules))
"""The rules' names, in declaration order."""


def _add_fields(cls, declared: list[tuple[str, Any, dataclasses.Field]]):
    """Put `declared` (name, annotation, field) first among the annotations of `cls` (before `@dataclass` runs)."""
    own = dict(vars(cls).get("__annotations__", {}))
    taken = sorted(name for name, _, _ in declared if name in own)
    if taken:
        raise TypeError(f"{cls.__name__} declares {taken} itself; they are rules: remove them from the class "
                        "(`trl_multiturn.rollout.rules.EpisodeRules` declares them)")
    cls.__annotations__ = {**{name: annotation for name, annotation, _ in declared}, **own}
    for name, _, f in declared:
        setattr(cls, name, f)
    return cls


def _config_types() -> dict[str, Any]:
    """Each rule's annotation as a config field's: what the command line can give (no functions; a JSON object as
    a string)."""
    hints = typing.get_type_hints(EpisodeRules)
    for name, tp in hints.items():
        if typing.get_origin(tp) in (Union, types.UnionType):
            kept = tuple(member for member in typing.get_args(tp) if member is not Callable)
            hints[name] = Union[kept] if len(kept) > 1 else kept[0]
    hints["chat_template_kwargs"] = dict | str | None
    return hints


def rule_fields(cls=None, *, names: tuple[str, ...] | None = None):
    """Class decorator (under `@dataclass`): give a config class a field for each rule of `names` (default, help,
    range and choices as `EpisodeRules` declares them); without `names`, for every rule but those TRL's RL configs
    declare themselves. `@rule_fields` or `@rule_fields(names=("system_prompt", ...))`."""
    if cls is None:
        return functools.partial(rule_fields, names=names)
    hints = _config_types()
    declared = [(f.name, hints[f.name], field_like(EpisodeRules, f.name)) for f in dataclasses.fields(EpisodeRules)
                if (f.name in names if names is not None else not f.metadata.get(TRL_FIELD))]
    return _add_fields(cls, declared)


def rule_overrides(cls):
    """Class decorator (under `@dataclass`): give an argument class an optional override of every rule, None (the
    default) meaning "as saved with the model" (`overrides`)."""
    hints = _config_types()
    declared = [(f.name, hints[f.name] | None, field_like(
        EpisodeRules, f.name, default=None, help=f"{f.metadata['help']} [as saved with the model, else {f.default!r}]"
    )) for f in dataclasses.fields(EpisodeRules)]
    return _add_fields(cls, declared)


def overrides(arguments) -> dict:
    """The rules an argument object of `rule_overrides` sets (not None), by name."""
    return {name: getattr(arguments, name) for name in RULES if getattr(arguments, name, None) is not None}
