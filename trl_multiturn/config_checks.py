"""Type and range checks of every config field, derived from the dataclass annotations.

A config class of the package calls `check_fields(self)` first thing in its `__post_init__`. Every field that a
class of the package declares, and every numeric field it inherits from TRL or transformers, is checked against
its annotation (`int`, `float`, `bool`, `str`, `dict`, `list[X]`, `Literal[...]`, an enum or other class,
`X | None`, unions of these; a part of an inherited annotation the checks do not understand takes any value) and,
when numeric, against its `Range`: the one its declaration gives (`config_field`), else `INHERITED_RANGES` (the
meaning of TRL's and transformers' fields, by name, e.g. `max_grad_norm >= 0`), else any finite number. The parents'
other fields (strings, lists, enums) are theirs to check: their `__post_init__` converts what the command line gives
(`debug=None`, `scale_rewards=False`). A float must be finite; a bool is not a number; an int field takes no float; a
`str` field whose metadata has `choices` (argparse's key, so the command line refuses the same values) takes one of
them.

A field declares its range beside its help with `config_field`:

    max_turns: int = config_field(8, "The most replies the model makes in one episode.", range=Range(ge=1))

The range is in the field's metadata (`f.metadata["range"]`) without reaching argparse: the parsers hand a copy of
every field's metadata to `add_argument`, and a `FieldMetadata` copies (and iterates) argparse's keys alone. A class
whose field means what another class's field means takes that declaration, `field_like(Other, "name")`, so that each
default, help and range is written once.

Inherited fields are checked as given (`check_fields(self)` before the parent's `__post_init__`, which turns some of
them into objects of its own); `check_fields(self, inherited=False)` checks the package's fields alone.

`Range()` is any finite number. Every error is a ValueError `Class.field=value: give <what is allowed>`, one line per
bad field.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import numbers
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union

PACKAGE = "trl_multiturn"


@dataclass(frozen=True)
class Range:
    """The finite numbers with value >= ge, > gt, <= le and < lt (each bound optional). `text` words the allowed
    values when the generated description ("an integer >= 1, or None") is not clear enough, e.g. to name a unit."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    text: str | None = None

    def __contains__(self, value: float) -> bool:
        return (math.isfinite(value)
                and (self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))

    def bounds(self) -> str:
        """The bounds in words: "in [0, 1]", ">= 1", "> 0 and < 1", or "" when there are none."""
        if self.ge is not None and self.le is not None:
            return f"in [{self.ge}, {self.le}]"
        parts = [f"{op} {bound}" for op, bound in ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))
                 if bound is not None]
        return " and ".join(parts)


class FieldMetadata(Mapping):
    """A config field's metadata (`config_field`): argparse's keys (`help`, `choices`), which iterating or copying
    it yields, and the package's own (`range`, ...), which a lookup finds (`metadata["range"]`, `.get`, `in`) and
    iterating or copying leaves out, so that the parsers, which hand their copy of the field's metadata to
    `add_argument` (`dict(field.metadata)` in transformers' `HfArgumentParser`, `field.metadata.copy()` in TRL's
    `TrlParser`), never see them."""

    def __init__(self, argparse_keys: dict, own_keys: dict):
        self._argparse, self._own = argparse_keys, own_keys

    def __getitem__(self, key):
        return self._argparse[key] if key in self._argparse else self._own[key]

    def __iter__(self):
        return iter(self._argparse)

    def __len__(self) -> int:
        return len(self._argparse)

    def copy(self) -> dict:
        return dict(self._argparse)

    def __repr__(self) -> str:
        return f"FieldMetadata({self._argparse!r}, {self._own!r})"


def config_field(default=dataclasses.MISSING, help: str = "", *, range: Range | None = None, choices=None,
                 default_factory=dataclasses.MISSING, **own_keys):
    """A config field declared with its default, its help and (a number) its range or (a string) its `choices`, as
    TRL's configs declare theirs (`field(default=..., metadata={"help": ...})`); `own_keys` are further metadata of
    the package's that argparse must not see (see `FieldMetadata`)."""
    argparse_keys = {"help": help, **({"choices": list(choices)} if choices is not None else {})}
    own = {**({"range": range} if range is not None else {}), **own_keys}
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata=FieldMetadata(argparse_keys, own))


def field_range(cls, name: str) -> Range | None:
    """The range the package's field `name` of `cls` declares (None: none)."""
    return _field(cls, name).metadata.get("range")


def field_like(cls, name: str, **changes) -> dataclasses.Field:
    """A new field declared as the field `name` of `cls` is (default, help, range, choices), with `changes` (any of
    `config_field`'s arguments) in their place: for a config class that takes another's field, so that the field's
    default, help and range are written once."""
    f = _field(cls, name)
    declared = {"default": f.default, "default_factory": f.default_factory, "help": f.metadata.get("help", ""),
                "range": f.metadata.get("range"), "choices": f.metadata.get("choices")}
    if {"default", "default_factory"} & set(changes):
        declared["default"] = declared["default_factory"] = dataclasses.MISSING
    return config_field(**{**declared, **changes})


def _field(cls, name: str) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(cls) if f.name == name)


# The ranges of TRL's and transformers' numeric fields that their meaning gives (a field of these names that a class
# of the package declares takes its own range instead). Those the multi-turn maths divides by or multiplies with
# (`num_generations`, `temperature`, `epsilon`, ...): TRL checks their other constraints (GRPO's
# `num_generations >= 2`) but lets 0, NaN or a negative value through.
_PROBABILITY = Range(ge=0, le=1)
INHERITED_RANGES = {
    "max_grad_norm": Range(ge=0, text="a number >= 0 (0 turns gradient clipping off)"),
    "weight_decay": Range(ge=0), "adam_beta1": Range(ge=0, lt=1), "adam_beta2": Range(ge=0, lt=1),
    "adam_epsilon": Range(ge=0),
    "num_train_epochs": Range(ge=0), "max_steps": Range(ge=-1, text="an integer >= -1 (-1: num_train_epochs decides)"),
    "warmup_ratio": _PROBABILITY, "warmup_steps": Range(ge=0, text="a number >= 0 (below 1: a fraction of the steps)"),
    "max_length": Range(ge=1), "max_prompt_length": Range(ge=1), "max_seq_length": Range(ge=1),
    "per_device_train_batch_size": Range(ge=1), "per_device_eval_batch_size": Range(ge=1),
    "gradient_accumulation_steps": Range(ge=1), "num_iterations": Range(ge=1), "steps_per_generation": Range(ge=1),
    "generation_batch_size": Range(ge=1), "eval_accumulation_steps": Range(ge=1),
    "logging_steps": Range(gt=0), "save_steps": Range(gt=0), "eval_steps": Range(gt=0),
    "save_total_limit": Range(ge=0),
    "seed": Range(ge=0), "data_seed": Range(ge=0), "dataloader_num_workers": Range(ge=0),
    "dataloader_prefetch_factor": Range(ge=1),
    "label_smoothing_factor": _PROBABILITY, "top_p": Range(gt=0, le=1),
    "temperature": Range(gt=0, text="a number > 0 (the logits are divided by it)"),
    "top_k": Range(ge=0), "min_p": _PROBABILITY, "repetition_penalty": Range(gt=0),
    "beta": Range(ge=0), "epsilon": Range(gt=0), "epsilon_high": Range(ge=0), "delta": Range(gt=0),
    "learning_rate": Range(ge=0, text="a number >= 0 (0 leaves the weights as they are)"),
    "num_generations": Range(ge=1, text="an integer >= 1 (episodes per task), or None"),
}


@dataclass(frozen=True)
class FieldCheck:
    """What one field takes: its annotation, its range (numeric fields) and its choices (`metadata["choices"]`).
    `inherited`: a field of TRL or transformers that no class of the package declares."""

    name: str
    annotation: Any
    range: Range | None = None
    choices: tuple | None = None
    inherited: bool = False

    def describe(self) -> str:
        """What the field takes, in words, e.g. "an integer >= 1, or None"."""
        if self.range is not None and self.range.text:
            return self.range.text
        options = _union_members(self.annotation)
        words = [self._describe_one(tp) for tp in options if tp is not type(None)]
        text = " or ".join(words)
        return f"{text}, or None" if type(None) in options else text

    def _describe_one(self, tp) -> str:
        if tp in (int, float):
            bounds = self.range.bounds() if self.range is not None else ""
            noun = "an integer" if tp is int else "a number" if bounds else "a finite number"
            return f"{noun} {bounds}".strip()
        if tp is str and self.choices:
            return f"one of {self.choices}"
        return _describe_type(tp)

    def problem(self, value) -> str | None:
        """None when `value` is allowed, else `name=value: give ...` (with the type given when it is the wrong one)."""
        if not _matches(value, self.annotation):
            return f"{self.name}={value!r}: give {self.describe()} (got {type(value).__name__})"
        if _is_number(value) and self.range is not None and value not in self.range:
            return f"{self.name}={value!r}: give {self.describe()}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"{self.name}={value!r}: give {self.describe()}"
        if isinstance(value, str) and self.choices and value not in self.choices:
            return f"{self.name}={value!r}: give {self.describe()}{did_you_mean(value, self.choices)}"
        return None


def parse_json_dict(name: str, value: dict | str | None, example: str) -> dict | None:
    """A dict field's value: a dict or None as given, a string (from the command line) parsed as a JSON object; a
    ValueError naming the field and showing `example` (a JSON object) otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name}={value!r} is not valid JSON ({exc}); write a JSON object such as "
                             f"'{example}'") from None
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"{name}={value!r}: give a dict (a JSON object on the command line)")
    return value


def did_you_mean(value: str, choices) -> str:
    """"; did you mean 'x'?" for the choice closest to a misspelt `value` (difflib's ratio >= 0.6), else ""."""
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_fields(config, inherited: bool = True) -> None:
    """Raise one ValueError naming every field of `config` (see the module docstring; with `inherited=False` only
    the package's own) whose value has the wrong type or lies outside its range."""
    problems = [p for check in field_checks(type(config)) if inherited or not check.inherited
                if (p := check.problem(getattr(config, check.name)))]
    if problems:
        raise ValueError("; ".join(f"{type(config).__name__}.{p}" for p in problems))


def check_value(name: str, value, annotation, range: Range | None = None) -> None:
    """Raise a ValueError `name=value: give ...` unless `value` matches `annotation` (and `range`, if numeric)."""
    problem = FieldCheck(name, annotation, range).problem(value)
    if problem:
        raise ValueError(problem)


@functools.cache
def field_checks(cls: type) -> tuple[FieldCheck, ...]:
    """The checks of every field of `cls`, in field order: each with its resolved annotation (the parts the checks
    do not understand replaced by `Any`), its range (its declaration's, else `INHERITED_RANGES`) and its
    `metadata["choices"]`."""
    annotations: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        annotations.update({name: (base, annotation) for name, annotation in vars(base).get("__annotations__",
                                                                                            {}).items()})
    checks = []
    for f in dataclasses.fields(cls):
        declared_by, annotation = annotations[f.name]
        own = declared_by.__module__.split(".")[0] == PACKAGE or "range" in f.metadata  # or a user's config_field
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, vars(sys.modules[declared_by.__module__]))
            except Exception:  # a parent's annotation naming what only its type checker imports
                if own:
                    raise
                annotation = Any
        if not own:  # a parent's numeric field: checked; its other fields are its own to check and convert
            annotation = _understood(annotation)
            annotation = annotation if is_numeric(annotation) else Any
        choices = f.metadata.get("choices")
        range_ = f.metadata.get("range") if own else INHERITED_RANGES.get(f.name)
        checks.append(FieldCheck(f.name, annotation, range_, tuple(choices) if choices and own else None,
                                 inherited=not own))
    return tuple(checks)


def _understood(annotation):
    """`annotation` with each part `_matches` cannot check (a generic other than list or dict, a callable, a
    forward reference) replaced by `Any`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (Union, types.UnionType):
        members = [_understood(member) for member in args]
        return Any if Any in members else Union[tuple(members)]
    if origin is Literal or annotation in (Any, type(None)):
        return annotation
    if origin is list and len(args) == 1:
        return list[_understood(args[0])]
    if origin is dict and len(args) == 2:
        return dict[_understood(args[0]), _understood(args[1])]
    return annotation if isinstance(annotation, type) and origin is None else Any


def is_numeric(annotation) -> bool:
    """Whether a field of this annotation takes numbers (and so needs a `Range`)."""
    return any(tp in (int, float) for tp in _union_members(annotation))


def _union_members(annotation) -> tuple:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _matches(value, annotation) -> bool:
    """Whether `value` has the type `annotation` names (an int is a float; a bool is neither)."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        return any(_matches(value, member) for member in typing.get_args(annotation))
    if origin is Literal:
        return value in typing.get_args(annotation)
    if annotation is type(None):
        return value is None
    if annotation is Any:
        return True
    if annotation is float:
        return _is_number(value)
    if annotation is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if origin is list:
        (item,) = typing.get_args(annotation)
        return isinstance(value, list) and all(_matches(v, item) for v in value)
    if origin is dict:
        key, item = typing.get_args(annotation)
        return isinstance(value, dict) and all(_matches(k, key) and _matches(v, item) for k, v in value.items())
    return isinstance(value, annotation)


def _describe_type(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return f"one of {typing.get_args(tp)}"
    if origin is list:
        return f"a list of {_plural(typing.get_args(tp)[0])}"
    words = {bool: "True or False", str: "a string", dict: "a dict", int: "an integer", float: "a finite number"}
    return words.get(origin or tp, f"a {getattr(origin or tp, '__name__', tp)}")


def _plural(tp) -> str:
    return {str: "strings", int: "integers", float: "numbers", bool: "booleans"}.get(tp, "values")
