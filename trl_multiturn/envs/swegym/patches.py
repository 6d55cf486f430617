"""Unified diffs: write one from two file maps, list the files a diff touches, and turn a diff into edit actions."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

from .actions import Action, Bash, Create, Replace, View

_DIFF_GIT = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def make_patch(before: dict[str, str], after: dict[str, str]) -> str:
    """A git-style unified diff (3 lines of context) that turns the files of `before` into those of `after`.

    Keys are repository-relative paths, values whole file texts; a path missing on one side is a created or a
    deleted file. `git apply` and `patch -p1` both accept the result.
    """
    chunks = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        header = [f"diff --git a/{path} b/{path}\n"]
        if old is None:
            header.append("new file mode 100644\n")
        elif new is None:
            header.append("deleted file mode 100644\n")
        lines = difflib.unified_diff(
            (old or "").splitlines(keepends=True),
            (new or "").splitlines(keepends=True),
            fromfile="/dev/null" if old is None else f"a/{path}",
            tofile="/dev/null" if new is None else f"b/{path}",
        )
        body = []
        for line in lines:
            body.append(line)
            if not line.endswith("\n"):
                body.append("\n\\ No newline at end of file\n")
        chunks.append("".join(header + body))
    return "".join(chunks)


def patch_paths(patch: str) -> list[str]:
    """The repository paths a git-style diff touches (its `b/` side), in order."""
    return [m.group(2) for m in _DIFF_GIT.finditer(patch)]


def written_paths(patch: str) -> list[str]:
    """The paths a git-style diff leaves a file at (those it adds or changes, not those it deletes), in order."""
    return [fp.path for fp in _split_files(patch) if not fp.deleted]


@dataclass
class _FilePatch:
    path: str
    new_file: bool = False
    deleted: bool = False
    hunks: list[tuple[int, list[str]]] = field(default_factory=list)  # (old start line, diff body lines)


def _split_files(patch: str) -> list[_FilePatch]:
    files: list[_FilePatch] = []
    for line in patch.splitlines(keepends=True):
        m = _DIFF_GIT.match(line.rstrip("\n"))
        if m:
            files.append(_FilePatch(m.group(2)))
            continue
        if not files:
            continue
        current = files[-1]
        if line.startswith(("new file mode", "--- /dev/null")):
            current.new_file = True
        elif line.startswith(("deleted file mode", "+++ /dev/null")):
            current.deleted = True
        elif line.startswith(("rename from", "copy from", "GIT binary patch", "Binary files")):
            raise ValueError(f"{current.path}: renames, copies and binary files have no edit-action form")
        elif (h := _HUNK.match(line)) is not None:
            current.hunks.append((int(h.group(1)), []))
        elif current.hunks and line[:1] in (" ", "-", "+", "\\"):
            current.hunks[-1][1].append(line)
    return files


def _sides(body: list[str]) -> tuple[str, str]:
    old, new = [], []
    for i, line in enumerate(body):
        if line.startswith("\\"):
            continue
        text = line[1:]
        if i + 1 < len(body) and body[i + 1].startswith("\\") and text.endswith("\n"):
            text = text[:-1]  # "\ No newline at end of file" applies to the line before it
        if line[0] in " -":
            old.append(text)
        if line[0] in " +":
            new.append(text)
    return "".join(old), "".join(new)


def patch_to_actions(patch: str, context: int = 3) -> list[Action]:
    """Edit actions that reproduce `patch`: view each changed region, then one `Replace` per hunk.

    A created file becomes a `Create`, a deleted one `rm` in bash. Each hunk's old side (context and removed
    lines) is replaced by its new side, so the edit applies when that text is unique in the file, which three
    lines of context almost always make it. Raises `ValueError` for what edits cannot express (binary files,
    renames, hunks without any old text).
    """
    actions: list[Action] = []
    for fp in _split_files(patch):
        if fp.deleted:
            actions.append(Bash(f"rm -- {fp.path}"))
            continue
        if fp.new_file:
            actions.append(Create(fp.path, "".join(_sides(body)[1] for _, body in fp.hunks)))
            continue
        for n, (start, body) in enumerate(fp.hunks):
            old, new = _sides(body)
            if not old:
                raise ValueError(f"{fp.path}: a hunk with no old text cannot be written as a replace")
            if n == 0:
                actions.append(View(fp.path, max(1, start - context), start + old.count("\n") + context))
            actions.append(Replace(fp.path, old, new))
    return actions
