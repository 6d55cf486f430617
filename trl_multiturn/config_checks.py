"""Type and range checks of every config field, derived from the dataclass annotations.

A config class of the package calls `check_fields(self)` first thing in its `__post_init__`. Each field that a
class of `trl_multiturn` declares, and each inherited TRL or transformers field that such a class names in its
`_RANGES` (the parents' fields our maths depends on, e.g. `learning_rate`; the others are TRL's to check), is
checked against its annotation (`int`, `float`, `bool`, `str`, `dict`, `list[X]`, `Literal[...]`, `X | None`,
unions of these) and, when numeric, against its `Range` in the `_RANGES` tables of the package's classes in the
MRO (a subclass's table extends its parents'). A float must be finite; a bool is not a number; an int field takes
no float; a `str` field whose metadata has `choices` (argparse's key, so the command line refuses the same values)
takes one of them. Field metadata cannot carry the ranges: `HfArgumentParser` passes every metadata key on to argparse.

    _RANGES = {"max_turns": Range(ge=1), "turn_gamma": Range(ge=0, le=1), "success_reward": Range()}

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


@dataclass(frozen=True)
class FieldCheck:
    """What one field takes: its annotation, its range (numeric fields) and its choices (`metadata["choices"]`)."""

    name: str
    annotation: Any
    range: Range | None = None
    choices: tuple | None = None

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


def check_fields(config) -> None:
    """Raise one ValueError naming every field of `config`'s own classes (see the module docstring) whose value has
    the wrong type or lies outside its range."""
    problems = [p for check in field_checks(type(config)) if (p := check.problem(getattr(config, check.name)))]
    if problems:
        raise ValueError("; ".join(f"{type(config).__name__}.{p}" for p in problems))


def check_value(name: str, value, annotation, range: Range | None = None) -> None:
    """Raise a ValueError `name=value: give ...` unless `value` matches `annotation` (and `range`, if numeric)."""
    problem = FieldCheck(name, annotation, range).problem(value)
    if problem:
        raise ValueError(problem)


@functools.cache
def field_checks(cls: type) -> tuple[FieldCheck, ...]:
    """The checks of the fields of `cls` that classes of this package declare or name in a `_RANGES` table (its
    own and its bases'), in field order: each with its resolved annotation, its `_RANGES` entry and its
    `metadata["choices"]`."""
    ranges: dict[str, Range] = {}
    annotations: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        annotations.update({name: (base, annotation) for name, annotation in vars(base).get("__annotations__",
                                                                                            {}).items()})
        if base.__module__.split(".")[0] == PACKAGE:
            ranges.update(vars(base).get("_RANGES", {}))
    checks = []
    for f in dataclasses.fields(cls):
        declared_by, annotation = annotations[f.name]
        if declared_by.__module__.split(".")[0] == PACKAGE or f.name in ranges:
            if isinstance(annotation, str):
                annotation = eval(annotation, vars(sys.modules[declared_by.__module__]))
            choices = f.metadata.get("choices")
            checks.append(FieldCheck(f.name, annotation, ranges.get(f.name),
                                     tuple(choices) if choices else None))
    return tuple(checks)


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
