"""Action parsers: turn a model reply into the action sent to the environment, or None if none can be read.

A parser is any callable `reply -> str | None`. Configs name a parser of `ACTION_PARSERS` (built-in, or added with
`@register_action_parser(name)`) or give `"module:function"`. A parser with a `bind(tokenizer)` method (e.g.
"tool_calls", which reads tool calls with TRL's response parsing) is bound to the policy's tokenizer by
`get_action_parser(spec, tokenizer)`.
"""

from __future__ import annotations

import importlib
import re
from typing import Callable

from ..registry import Registry
from .tool_calls import ToolCallParser

ActionParser = Callable[[str], "str | None"]
ACTION_PARSERS: Registry[ActionParser] = Registry("action_parser")
register_action_parser = ACTION_PARSERS.register

# A tag's content holds no opening tag: in "I answer with <action>. <action>go</action>" the tag is the second one.
_ACTION_TAG = re.compile(r"<action>((?:(?!<action>).)*?)</action>", re.DOTALL | re.IGNORECASE)
_ACTION_LINE = re.compile(r"\s*action\s*:(.*)", re.IGNORECASE)


@register_action_parser("first_line")
def first_line(reply: str) -> str | None:
    """The reply's first non-empty line, stripped (the paper's format: the reply *is* the command)."""
    for line in reply.splitlines():
        if line.strip():
            return line.strip()
    return None


@register_action_parser("think_then_act")
def think_then_act(reply: str) -> str | None:
    """For replies that reason first: the text of the last `<action>...</action>` tag, else the text after the
    last `Action:` (on its line, or on the next non-blank line when none follows the colon); None when the reply
    names no action or the last one is blank."""
    tags = _ACTION_TAG.findall(reply)
    if tags:
        return tags[-1].strip() or None
    lines = reply.splitlines()
    for index in range(len(lines) - 1, -1, -1):
        match = _ACTION_LINE.match(lines[index])
        if match:
            action = match.group(1).strip() or next((line.strip() for line in lines[index + 1:] if line.strip()), "")
            return action or None
    return None


@register_action_parser("whole_reply")
def whole_reply(reply: str) -> str | None:
    """The whole reply, stripped (for environments that parse their own action format, e.g. SWE-Gym)."""
    return reply.strip() or None


register_action_parser("tool_calls")(ToolCallParser())


def get_action_parser(spec: str | ActionParser, tokenizer=None) -> ActionParser:
    """Resolve a parser from a callable, a built-in name, or a `"package.module:function"` path; with `tokenizer`, a
    parser that reads replies through it (one with a `bind` method) is bound to it."""
    parser = _resolve_action_parser(spec)
    if tokenizer is not None and callable(getattr(parser, "bind", None)):
        return parser.bind(tokenizer)
    return parser


def _resolve_action_parser(spec: str | ActionParser) -> ActionParser:
    if callable(spec):
        return spec
    if spec in ACTION_PARSERS:
        return ACTION_PARSERS.lookup(spec)
    if isinstance(spec, str) and ":" in spec:
        module, _, name = spec.partition(":")
        try:
            parser = getattr(importlib.import_module(module), name)
        except Exception as exc:  # an import runs the module's code: any error means "this path is not usable"
            raise ValueError(f"action_parser={spec!r} cannot be loaded ({type(exc).__name__}: {exc}). Give a "
                             "'package.module:function' path importable where training runs, or one of "
                             f"{sorted(ACTION_PARSERS)}.") from None
        if not callable(parser):
            raise ValueError(f"action_parser={spec!r} names a {type(parser).__name__}, not a function reply -> "
                             "action")
        return parser
    raise ValueError(
        f"action_parser={spec!r} is not a known parser. Use one of {sorted(ACTION_PARSERS)} or a "
        "'package.module:function' path to a callable reply -> action."
    )
