"""Rollouts: episodes, token-exact chat deltas, environment pools, action parsing, and the episode runner
(`EpisodeRunner`, which plays rows of tasks into `Episode`s)."""

from .batch import RolloutBatch
from .chat_tokens import ChatTemplateError, ChatTokenBuilder
from .env_pool import EnvFailure, EnvPool
from .episode import Episode
from .parsing import ACTION_PARSERS, get_action_parser
from .runner import EpisodeRunner

__all__ = [
    "ACTION_PARSERS",
    "ChatTemplateError",
    "ChatTokenBuilder",
    "EnvFailure",
    "EnvPool",
    "Episode",
    "EpisodeRunner",
    "RolloutBatch",
    "get_action_parser",
]
