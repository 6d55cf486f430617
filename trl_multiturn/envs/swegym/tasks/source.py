"""A shipped task in source form, and the reproducible build of its git repository.

Each task module defines `SOURCE = TaskSource(...)`: the project's history as a list of commits (message and the
files each one writes), the gold fix and the test change as exact-text edits, and the test ids SWE-bench calls
FAIL_TO_PASS and PASS_TO_PASS. `build_repo` replays the commits with a fixed author, committer and dates, so the
base commit's hash is the same on every machine; the hash is recorded in the task and the build checks it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from ..patches import make_patch

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
    fix: tuple[Edit, ...]
    tests: tuple[Edit, ...]
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

    def files_at_base(self) -> dict[str, str]:
        files = dict(scaffold_files(self.name, self.summary))
        for _, changes in self.commits:
            files.update(changes)
        return files

    def gold_patch(self) -> str:
        base = self.files_at_base()
        return make_patch(base, apply_edits(base, self.fix))

    def test_patch(self) -> str:
        base = self.files_at_base()
        return make_patch(base, apply_edits(base, self.tests))

    def row(self) -> dict:
        """The task as a SWE-bench / SWE-Gym row, plus `test_cmd` (how this project runs its tests)."""
        return {
            "instance_id": self.instance_id,
            "repo": self.repo,
            "base_commit": self.base_commit,
            "patch": self.gold_patch(),
            "test_patch": self.test_patch(),
            "problem_statement": self.problem_statement.strip() + "\n",
            "hints_text": self.hints_text,
            "created_at": self.created_at,
            "version": "0.1",
            "FAIL_TO_PASS": list(self.fail_to_pass),
            "PASS_TO_PASS": list(self.pass_to_pass),
            "environment_setup_commit": self.base_commit,
            "test_cmd": TEST_CMD,
        }


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
