"""The one cache-folder rule: everything trl-multiturn keeps between runs lives in `cache_dir(subdir)`.

    cache_dir(subdir) = $TRL_MULTITURN_CACHE/subdir, else $XDG_CACHE_HOME/trl_multiturn/subdir
                        ($XDG_CACHE_HOME defaults to ~/.cache)

Sub-folders: `textworld_games` (generated games), `swegym` (built task repositories and the tests' Python),
`smollm2-135m-instruct` (the offline default model).
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "TRL_MULTITURN_CACHE"
FOLDER = "trl_multiturn"


def cache_root() -> Path:
    """`$TRL_MULTITURN_CACHE`, else `$XDG_CACHE_HOME/trl_multiturn` (`~/.cache/trl_multiturn` by default)."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / FOLDER


def cache_dir(subdir: str) -> Path:
    """The folder of `subdir` under the cache root. Not created here."""
    return cache_root() / subdir
