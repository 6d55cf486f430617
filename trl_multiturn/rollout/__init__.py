"""Rollouts: episodes, token-exact chat deltas, environment pools, action parsing, and the episode runner
(`EpisodeRunner`, which plays rows of tasks into `Episode`s)."""

from ..lazy import lazy_getattr

_PUBLIC = {
    "ACTION_PARSERS": ".parsing",
    "ChatTemplateError": ".chat_tokens",
    "ChatTokenBuilder": ".chat_tokens",
    "EnvFailure": ".env_pool",
    "EnvPool": ".env_pool",
    "Episode": ".episode",
    "EpisodeRules": ".rules",
    "EpisodeRunner": ".runner",
    "Status": ".episode",
    "Turn": ".episode",
    "get_action_parser": ".parsing",
}

__all__ = list(_PUBLIC)

# Lazy, so that an environment worker or a Ray actor importing `rollout.slot_env` does not import torch (~250 MiB
# per process) for names it never uses.
__getattr__ = lazy_getattr(__name__, _PUBLIC)
