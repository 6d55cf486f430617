"""Deprecated name of `trl_multiturn.envs.alfworld.generator`, the offline ALFWorld game generator (the README's
`trl_multiturn.envs.alfworld_gen.generate_games(...)` keeps working); import from the new path."""

from .alfworld.generator import ALFWorldGenConfig, GeneratedGame, GenerationError, generate_game, generate_games

__all__ = ["ALFWorldGenConfig", "GeneratedGame", "GenerationError", "generate_game", "generate_games"]
