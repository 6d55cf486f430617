"""The offline SWE-Gym task set: twelve small real Python projects, each with a bug, an issue and a gold patch.

Nothing is downloaded: each task is a folder of files next to this module (`source.py` says which), and
`source.build_repo` builds its repository from them, with its git history made at build time (fixed author and
dates, so the recorded `base_commit` hashes reproduce). `load_tasks()` returns the SWE-bench-schema rows as a
`datasets.Dataset`; `LocalSandbox` builds (once, into a cache folder) the repository a row names through
`shipped_repo`.

To change a task, edit its folder and run `python -m trl_multiturn.envs.swegym.tasks` to print the new hashes (and
the patches' new text where the base changed: they are diffs against it).
"""

from __future__ import annotations

import functools
from pathlib import Path

from ....cache import cache_dir
from ...base import TaskError
from .source import Edit, TaskSource, build_repo, load_source

TASK_NAMES = (
    "intervals",
    "semver",
    "csvline",
    "slugkit",
    "lrucache",
    "durations",
    "matrix",
    "roman",
    "envfile",
    "ledger",
    "wordfreq",
    "rpn",
)

__all__ = ["TASK_NAMES", "Edit", "TaskSource", "build_repo", "default_cache_dir", "load_tasks", "shipped_repo",
           "task_rows", "task_sources"]


@functools.cache
def _source(name: str) -> TaskSource:
    return load_source(Path(__file__).parent / name)


def task_sources() -> list[TaskSource]:
    return [_source(name) for name in TASK_NAMES]


def task_rows(names: list[str] | tuple[str, ...] | None = None) -> list[dict]:
    """SWE-bench-schema rows of the shipped tasks (all of them, or those named)."""
    sources = {source.name: source for source in task_sources()}
    unknown = set(names or ()) - set(sources)
    if unknown:
        raise ValueError(f"unknown task names {sorted(unknown)}: choose from {list(TASK_NAMES)}")
    return [sources[name].row() for name in (names or TASK_NAMES)]


def load_tasks(names: list[str] | tuple[str, ...] | None = None):
    """The shipped tasks as a `datasets.Dataset` (one row per task, SWE-bench columns)."""
    from datasets import Dataset

    return Dataset.from_list(task_rows(names))


def default_cache_dir() -> Path:
    """Where shipped repositories are built: `cache_dir("swegym")`, i.e. `$TRL_MULTITURN_CACHE/swegym`, else
    `~/.cache/trl_multiturn/swegym` (see `trl_multiturn.cache`)."""
    return cache_dir("swegym")


def shipped_repo(repo: str, base_commit: str, cache_dir: str | Path | None = None) -> Path | None:
    """Path of the built repository for a shipped `repo` (building it on first use), or None for other repos."""
    source = next((s for s in task_sources() if s.repo == repo), None)
    if source is None:
        return None
    if base_commit != source.base_commit:
        raise TaskError(
            f"base_commit={base_commit!r} does not match the shipped task {repo} (built at {source.base_commit}): "
            "use the rows from trl_multiturn.envs.swegym.load_tasks()"
        )
    dest = Path(cache_dir or default_cache_dir()) / f"{source.name}-{source.base_commit[:12]}"
    if not (dest / ".git").is_dir():
        dest.parent.mkdir(parents=True, exist_ok=True)
        build_repo(source, dest)
    return dest
