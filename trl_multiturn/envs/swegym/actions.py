"""The SWE-Gym action format: one XML-style tag per reply, parsed into a small action record.

A reply may hold free text (reasoning) around the action; the first action tag in the reply is executed and
the rest of the reply is ignored. Five actions exist:

    <bash>COMMAND</bash>                      run COMMAND with bash in the repository root
    <view path="PATH" lines="START-END"/>     show a file with line numbers (`lines` optional), or list a folder
    <replace path="PATH">
    <old>
    EXACT TEXT (must occur exactly once)
    </old>
    <new>
    REPLACEMENT TEXT
    </new>
    </replace>                                replace one occurrence of the old text by the new text
    <create path="PATH">
    CONTENT
    </create>                                 create (or overwrite) a file
    <submit/>                                 end the episode; the current diff is graded

Whitespace rules: a `<bash>` body is stripped. Inside `<old>` and `<new>` one newline right after the opening
tag and one right before the closing tag are dropped, so the block form above and the inline form
`<old>return a - b</old>` mean the same text. A `<create>` body drops one leading newline and gets a final newline
if it has none. Bodies cannot contain their own closing tag.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

COMMAND_REFERENCE = """\
Reply with exactly one action per turn, written as one of these tags (text around the tag is ignored):

<bash>COMMAND</bash>
    Run COMMAND with bash in the repository root; you get its output and exit code.
<view path="PATH" lines="START-END"/>
    Show PATH with line numbers (`lines` is optional); a folder is listed.
<replace path="PATH">
<old>
EXACT TEXT TO REPLACE (must occur exactly once in the file)
</old>
<new>
REPLACEMENT TEXT
</new>
</replace>
    Replace the old text by the new text.
<create path="PATH">
FILE CONTENT
</create>
    Create PATH (or overwrite it) with the content.
<submit/>
    Finish: your changes to the repository are submitted and graded by the project's tests.

Paths are relative to the repository root."""


@dataclass(frozen=True)
class Bash:
    command: str


@dataclass(frozen=True)
class View:
    path: str
    start: int | None = None
    end: int | None = None


@dataclass(frozen=True)
class Replace:
    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Create:
    path: str
    content: str


@dataclass(frozen=True)
class Submit:
    pass


Action = Union[Bash, View, Replace, Create, Submit]


class ActionParseError(ValueError):
    """A reply holds no action, or a malformed one; the message says what to write instead."""


_OPEN = re.compile(r"<(bash|view|replace|create|submit)\b([^>]*?)(/?)>", re.IGNORECASE)
_ATTR = re.compile(r"""(\w+)\s*=\s*(?:"([^"]*)"|'([^']*)')""")
_LINES = re.compile(r"^\s*(\d+)?\s*[-:,]\s*(-1|\d+)?\s*$|^\s*(\d+)\s*$")


def _attrs(raw: str) -> dict[str, str]:
    return {m.group(1).lower(): m.group(2) if m.group(2) is not None else m.group(3) for m in _ATTR.finditer(raw)}


def _body(text: str, start: int, tag: str) -> str:
    close = re.compile(rf"</{tag}\s*>", re.IGNORECASE).search(text, start)
    if close is None:
        raise ActionParseError(f"<{tag}> is not closed: end it with </{tag}>.")
    return text[start : close.start()]


def _trim_one_newline(text: str) -> str:
    if text.startswith("\n"):
        text = text[1:]
    if text.endswith("\n"):
        text = text[:-1]
    return text


def _path(attrs: dict[str, str], tag: str) -> str:
    path = (attrs.get("path") or "").strip()
    if not path:
        raise ActionParseError(f'<{tag}> needs a path attribute, e.g. <{tag} path="src/module.py" ...>.')
    return path


def _line_range(spec: str | None) -> tuple[int | None, int | None]:
    if spec is None or not spec.strip():
        return None, None
    m = _LINES.match(spec)
    if m is None:
        raise ActionParseError(f'lines="{spec}" is not a range: write lines="START-END", e.g. lines="10-40".')
    if m.group(3) is not None:
        line = int(m.group(3))
        return line, line
    start = int(m.group(1)) if m.group(1) else None
    end = int(m.group(2)) if m.group(2) and m.group(2) != "-1" else None
    return start, end


def parse_action(reply: str) -> Action:
    """Parse the first action tag of `reply` (see the module docstring); raise `ActionParseError` if there is none."""
    m = _OPEN.search(reply)
    if m is None:
        raise ActionParseError("no action found: write one of <bash>, <view>, <replace>, <create> or <submit/>.")
    tag, attrs, self_closing = m.group(1).lower(), _attrs(m.group(2)), bool(m.group(3))
    if tag == "submit":
        return Submit()
    if tag == "view":
        start, end = _line_range(attrs.get("lines"))
        return View(_path(attrs, tag), start, end)
    if self_closing:
        raise ActionParseError(f"<{tag}/> needs a body: write <{tag} ...>...</{tag}>.")
    body = _body(reply, m.end(), tag)
    if tag == "bash":
        command = body.strip()
        if not command:
            raise ActionParseError("<bash></bash> is empty: put a shell command between the tags.")
        return Bash(command)
    path = _path(attrs, tag)
    if tag == "create":
        content = body[1:] if body.startswith("\n") else body
        return Create(path, content if content.endswith("\n") or not content else content + "\n")
    old = re.search(r"<old>(.*?)</old>", body, re.DOTALL | re.IGNORECASE)
    new = re.search(r"<new>(.*?)</new>", body, re.DOTALL | re.IGNORECASE)
    if old is None or new is None:
        raise ActionParseError("<replace> needs an <old>...</old> block and a <new>...</new> block.")
    old_text = _trim_one_newline(old.group(1))
    if not old_text:
        raise ActionParseError("<old></old> is empty: give the exact text to replace.")
    return Replace(path, old_text, _trim_one_newline(new.group(1)))


def format_action(action: Action) -> str:
    """Write `action` in the reply format; `parse_action(format_action(a)) == a` for every `a` it can return."""
    if isinstance(action, Bash):
        return f"<bash>{action.command}</bash>"
    if isinstance(action, View):
        if action.start is None and action.end is None:
            return f'<view path="{action.path}"/>'
        end = "" if action.end is None else action.end
        return f'<view path="{action.path}" lines="{action.start or 1}-{end}"/>'
    if isinstance(action, Replace):
        return f'<replace path="{action.path}">\n<old>\n{action.old}\n</old>\n<new>\n{action.new}\n</new>\n</replace>'
    if isinstance(action, Create):
        return f'<create path="{action.path}">\n{action.content}</create>'
    if isinstance(action, Submit):
        return "<submit/>"
    raise TypeError(f"not an action: {action!r}")
