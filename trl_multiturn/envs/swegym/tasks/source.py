"""A shipped task as files, and the reproducible build of its git repository.

Each task is a folder (`<name>/`) of data, read by `load_source`:

    task.json             summary (the README's line), commits (their messages, oldest first), FAIL_TO_PASS,
                          PASS_TO_PASS (SWE-bench's test ids) and base_commit (the hash the build must reproduce)
    problem_statement.md  the issue
    gold.patch            the fix, and test.patch the test change, as unified diffs against the base commit
    commits/<k>/...       the files commit k writes (k = 1, 2, ...), at their paths in the repository

Every repository also starts with the same scaffold (`scaffold_files`: packaging, pytest settings, ignore list and a
README). `build_repo` replays the commits with a fixed author, committer and dates, so the base commit's hash is the
same on every machine; the hash is recorded in the task and the build checks it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from ..actions import Create, Replace, View
from ..patches import patch_to_actions

# Plugin autoloading costs ~1 s a run and the shipped projects need no plugins.
TEST_CMD = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -rA -p no:cacheprovider"
AUTHOR = ("trl-multiturn tasks", "tasks@trl-multiturn.invalid")
ORG = "trl-multiturn"


@dataclass(frozen=True)
class Edit:
    """Replace the one occurrence of `old` in `path` by `new`; `old=None` appends `new` (creating the file)."""

    path: str
    old: str | None
    new: str


@dataclass(frozen=True)
class TaskSource:
    name: str
    summary: str
    problem_statement: str
    commits: tuple[tuple[str, dict[str, str]], ...]
    patch: str
    test_patch: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    base_commit: str
    created_at: str = "2024-06-01T12:00:00Z"
    hints_text: str = ""

    @property
    def instance_id(self) -> str:
        return f"{ORG}__{self.name}-1"

    @property
    def repo(self) -> str:
        return f"{ORG}/{self.name}"

    @property
    def fix(self) -> tuple[Edit, ...]:
        """The gold patch as exact-text edits, one per hunk (its old side, context included, by its new side)."""
        return patch_edits(self.patch)

    @property
    def tests(self) -> tuple[Edit, ...]:
        """The test patch as exact-text edits, as `fix`."""
        return patch_edits(self.test_patch)

    def files_at_base(self) -> dict[str, str]:
        files = dict(scaffold_files(self.name, self.summary))
        for _, changes in self.commits:
            files.update(changes)
        return files

    def row(self) -> dict:
        """The task as a SWE-bench / SWE-Gym row, plus `test_cmd` (how this project runs its tests)."""
        return {
            "instance_id": self.instance_id,
            "repo": self.repo,
            "base_commit": self.base_commit,
            "patch": self.patch,
            "test_patch": self.test_patch,
            "problem_statement": self.problem_statement,
            "hints_text": self.hints_text,
            "created_at": self.created_at,
            "version": "0.1",
            "FAIL_TO_PASS": list(self.fail_to_pass),
            "PASS_TO_PASS": list(self.pass_to_pass),
            "environment_setup_commit": self.base_commit,
            "test_cmd": TEST_CMD,
        }


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8")  # byte for byte: no newline translation


def _tree(root: Path) -> dict[str, str]:
    """Every file under `root` by its path relative to it, without Python's byte-code caches."""
    return {path.relative_to(root).as_posix(): _read(path) for path in sorted(root.rglob("*"))
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"}


def load_source(folder: str | Path) -> TaskSource:
    """The task stored in `folder` (the module docstring's files); its name is the folder's."""
    folder = Path(folder)
    meta = json.loads(_read(folder / "task.json"))
    commits = tuple((message, _tree(folder / "commits" / str(k))) for k, message in enumerate(meta["commits"], 1))
    return TaskSource(
        name=folder.name, summary=meta["summary"], problem_statement=_read(folder / "problem_statement.md"),
        commits=commits, patch=_read(folder / "gold.patch"), test_patch=_read(folder / "test.patch"),
        fail_to_pass=tuple(meta["FAIL_TO_PASS"]), pass_to_pass=tuple(meta["PASS_TO_PASS"]),
        base_commit=meta["base_commit"],
    )


def patch_edits(patch: str) -> tuple[Edit, ...]:
    """`patch` as `Edit`s: a hunk replaces its old side by its new side, a created file is appended to nothing; a
    deleted file has no `Edit` form (ValueError)."""
    edits = []
    for action in patch_to_actions(patch):
        if isinstance(action, Replace):
            edits.append(Edit(action.path, action.old, action.new))
        elif isinstance(action, Create):
            edits.append(Edit(action.path, None, action.content))
        elif not isinstance(action, View):
            raise ValueError(f"a shipped task's patch only edits and creates files, not {action}")
    return tuple(edits)


def scaffold_files(name: str, summary: str) -> dict[str, str]:
    """The files every shipped project starts with: packaging, pytest settings, ignore list and a README."""
    return {
        "README.md": f"# {name}\n\n{summary}\n\nRun the tests with `python -m pytest`.\n",
        "pyproject.toml": (
            f'[project]\nname = "{name}"\nversion = "0.1.0"\nrequires-python = ">=3.9"\n\n'
            '[tool.pytest.ini_options]\npythonpath = ["."]\ntestpaths = ["tests"]\n'
        ),
        ".gitignore": "__pycache__/\n*.pyc\n.pytest_cache/\n",
    }


def apply_edits(files: dict[str, str], edits: tuple[Edit, ...]) -> dict[str, str]:
    out = dict(files)
    for edit in edits:
        text = out.get(edit.path)
        if edit.old is None:
            out[edit.path] = (text or "") + edit.new
            continue
        if text is None or text.count(edit.old) != 1:
            found = 0 if text is None else text.count(edit.old)
            raise ValueError(f"edit of {edit.path}: old text found {found} times, expected exactly once")
        out[edit.path] = text.replace(edit.old, edit.new)
    return out


def git_env(when: str | None = None) -> dict[str, str]:
    """Environment for git with no user or system config (so nothing local changes hashes or diffs)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "LC_ALL": "C",
    }
    if when is not None:
        env.update(
            GIT_AUTHOR_NAME=AUTHOR[0],
            GIT_AUTHOR_EMAIL=AUTHOR[1],
            GIT_COMMITTER_NAME=AUTHOR[0],
            GIT_COMMITTER_EMAIL=AUTHOR[1],
            GIT_AUTHOR_DATE=when,
            GIT_COMMITTER_DATE=when,
        )
    return env


def git(args: list[str], cwd: str | Path, when: str | None = None) -> str:
    result = subprocess.run(
        ["git", *args], cwd=cwd, env=git_env(when), capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {cwd}: {result.stderr.strip()}")
    return result.stdout


def _write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8", newline="\n")
        path.chmod(0o644)


def build_repo(source: TaskSource, dest: str | Path) -> str:
    """Build `source`'s repository at `dest` (must not exist) and return its HEAD, the task's base commit.

    The first commit holds the scaffold and the first entry of `source.commits`; commit k is dated k hours after
    2024-05-01 12:00 UTC. Raises `RuntimeError` when the result does not hash to `source.base_commit` (an empty
    `base_commit` skips the check, for writing a new task). Builds in a temporary sibling folder and renames it
    into place, so concurrent builders of one task never see a half-built repository.
    """
    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}")
    tmp.mkdir(parents=True)
    try:
        git(["-c", "init.defaultBranch=main", "init", "-q"], tmp)
        for k, (message, files) in enumerate(source.commits):
            changes = {**scaffold_files(source.name, source.summary), **files} if k == 0 else files
            _write_tree(tmp, changes)
            when = f"2024-05-01T{12 + k:02d}:00:00+00:00"
            git(["add", "-A"], tmp)
            git(["commit", "-q", "--no-verify", "-m", message], tmp, when=when)
        head = git(["rev-parse", "HEAD"], tmp).strip()
        if source.base_commit and head != source.base_commit:
            raise RuntimeError(
                f"task {source.name}: the build hashed to {head}, the task records {source.base_commit}; "
                "the sources changed without updating base_commit"
            )
        try:
            tmp.rename(dest)
        except OSError:
            if not (dest / ".git").is_dir():
                raise
        return head
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
