"""ALFWorld: household tasks in ALFWorld's own text engine, over its dataset layout.

`ALFWorldEnv` plays a `game.tw-pddl`; `list_tasks` lists a data folder's games as task rows; the offline generator
(`trl_multiturn.envs.alfworld.generator`, `trl-multiturn make-games --env alfworld`) writes new games in the same
layout; `alfworld_tasks` builds a task set from either.
"""

from .engine import ExpertFailed, play_expert
from .env import ALFWorldConfig, ALFWorldEnv
from .tasks import SPLITS, TASK_TYPES, alfworld_tasks, list_tasks

__all__ = ["ALFWorldConfig", "ALFWorldEnv", "ExpertFailed", "SPLITS", "TASK_TYPES", "alfworld_tasks", "list_tasks",
           "play_expert"]
