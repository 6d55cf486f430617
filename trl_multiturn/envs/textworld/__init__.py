"""TextWorld: text games played on the real TextWorld engine, and everything only TextWorld uses.

`env.py` (`TextWorldEnv`, `TextWorldConfig`), `commands.py` (what the adapter refuses before a reply reaches the
game), `games.py` (generating and caching games), `tasks.py` (`textworld_tasks`, `textworld_mixture`: task sets
from the split seed ranges). The examples' and `trl-multiturn train`'s arguments live in `trl_multiturn.commands`.
Names are imported on first use, so that importing the package does not import the TextWorld engine.
"""

from ...lazy import lazy_getattr

_LAZY = {
    "TextWorldConfig": ".env",
    "TextWorldEnv": ".env",
    "default_games_dir": ".env",
    "parse_shape": ".tasks",
    "textworld_mixture": ".tasks",
    "textworld_tasks": ".tasks",
}

__all__ = list(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY)
