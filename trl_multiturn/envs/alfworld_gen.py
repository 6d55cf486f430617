"""Deprecated name of `trl_multiturn.envs.alfworld.generator`, the offline ALFWorld game generator: the README
documented `trl_multiturn.envs.alfworld_gen.generate_games(...)` before the generator moved into the ALFWorld
package, so that import keeps working. New code imports from `trl_multiturn.envs.alfworld.generator`."""

from .alfworld.generator import ALFWorldGenConfig, GeneratedGame, GenerationError, generate_game, generate_games

__all__ = ["ALFWorldGenConfig", "GeneratedGame", "GenerationError", "generate_game", "generate_games"]
