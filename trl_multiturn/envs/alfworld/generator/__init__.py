"""Offline ALFWorld task generator: new games for all six ALFRED task types, in ALFWorld's dataset layout.

    from trl_multiturn.envs.alfworld.generator import ALFWorldGenConfig, generate_games
    generate_games("data/alfworld", seeds=range(10), config=ALFWorldGenConfig(num_receptacles=10))

or `trl-multiturn make-games --env alfworld`. Then `list_tasks("data/alfworld")` gives the task rows.
"""

from .generate import ALFWorldGenConfig, GeneratedGame, GenerationError, generate_game, generate_games

__all__ = ["ALFWorldGenConfig", "GeneratedGame", "GenerationError", "generate_game", "generate_games"]
