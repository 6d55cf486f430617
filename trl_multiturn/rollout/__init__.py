"""Rollouts: episodes, token-exact chat deltas, environment pools, action parsing, and the collator."""

from .chat_tokens import ChatTemplateError, ChatTokenBuilder
from .collator import MultiTurnRolloutCollator
from .env_pool import EnvFailure, EnvPool
from .episode import Episode
from .parsing import ACTION_PARSERS, get_action_parser

__all__ = [
    "ACTION_PARSERS",
    "ChatTemplateError",
    "ChatTokenBuilder",
    "EnvFailure",
    "EnvPool",
    "Episode",
    "MultiTurnRolloutCollator",
    "get_action_parser",
]
