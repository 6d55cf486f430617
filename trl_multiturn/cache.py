"""The one cache-folder rule: everything trl-multiturn keeps between runs lives in `cache_dir(subdir)`.

    cache_dir(subdir) = $TRL_MULTITURN_CACHE/subdir, else $XDG_CACHE_HOME/trl_multiturn/subdir
                        ($XDG_CACHE_HOME defaults to ~/.cache)

Sub-folders: `textworld_games` (generated games), `swegym` (built task repositories and the tests' Python),
`smollm2-135m-instruct` (the offline default model).

Folders from before this rule are still found. Without $TRL_MULTITURN_CACHE, a sub-folder that does not exist
yet falls back to the same sub-folder under `~/.cache/trl-multiturn` (the offline model's old home) or
`~/.cache/trl_multiturn` (SWE-Gym's, which ignored $XDG_CACHE_HOME) when that one exists, with a warning that says
where to move it. `$TRL_MULTITURN_GAMES_DIR` (the old games folder variable) still works, with a FutureWarning.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

ENV_VAR = "TRL_MULTITURN_CACHE"
FOLDER = "trl_multiturn"
LEGACY_FOLDERS = ("trl-multiturn", "trl_multiturn")
"""Folder names under ~/.cache used before the rule, searched in this order."""
DEPRECATED_ENV_VARS = {"textworld_games": "TRL_MULTITURN_GAMES_DIR"}
"""Sub-folder -> the variable that used to name that sub-folder itself."""

logger = logging.getLogger(__name__)
_warned: set[Path] = set()


def cache_root() -> Path:
    """`$TRL_MULTITURN_CACHE`, else `$XDG_CACHE_HOME/trl_multiturn` (`~/.cache/trl_multiturn` by default)."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / FOLDER


def cache_dir(subdir: str) -> Path:
    """The folder of `subdir` under the cache root (see the module docstring for the old folders it still finds).
    Not created here."""
    old_var = DEPRECATED_ENV_VARS.get(subdir)
    if old_var and os.environ.get(old_var):
        warnings.warn(f"${old_var} is deprecated: set ${ENV_VAR} (this folder is then ${ENV_VAR}/{subdir}) or pass "
                      "the folder explicitly", FutureWarning, stacklevel=2)
        return Path(os.environ[old_var]).expanduser()
    path = cache_root() / subdir
    if os.environ.get(ENV_VAR) or path.exists():
        return path
    for name in LEGACY_FOLDERS:
        legacy = Path.home() / ".cache" / name / subdir
        if legacy != path and legacy.exists():
            if legacy not in _warned:
                _warned.add(legacy)
                logger.warning("Using the cache folder %s from an older trl-multiturn; move it to %s (or set $%s) "
                               "to keep using it when this fallback is removed.", legacy, path, ENV_VAR)
            return legacy
    return path
