"""Third-party warnings a trl-multiturn user cannot act on, filtered once when the package is imported.

Each entry is one exact warning (category and the start of its message) raised by a dependency's own call into
another dependency, with the reason it says nothing to the user. Everything else is left as it is: a warning about
something the user wrote still shows.
"""

from __future__ import annotations

import logging
import warnings

KNOWN_WARNINGS = (
    (FutureWarning, r"`gradient_checkpointing(_kwargs|_enable|_disable)?` is deprecated and will be removed in v6",
     "transformers 5.2x renamed gradient checkpointing to activation checkpointing; TRL 1.16's configs (their "
     "`gradient_checkpointing` default) and trainers still use the old names, so every run warns, whatever the "
     "user sets"),
)


NO_REWARD_LOGGERS = ("trl.trainer.grpo_trainer", "trl.trainer.rloo_trainer")
"""TRL's trainers log "All reward functions returned None for the following kwargs: {...}" (the row's whole
kwargs) for any row whose every reward is None. Ours always scores the environment's return first
(`environment_return`), which is None only for a failed episode (counted in `episodes/failed`) or a step-wise
padding row (trained on nothing), so with `'episode_return': None` in the row the log says nothing the user can act
on; a step-wise run with padding logged it on every step."""


def _not_an_unscored_episode(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    # accelerate's adapter may prefix "[RANK n] "
    return not ("All reward functions returned None" in message and "'episode_return': None" in message)


def filter_known_warnings() -> None:
    """Ignore each of `KNOWN_WARNINGS` (added in front of the filters: they win over `-W default`), and TRL's
    "All reward functions returned None" log for our failed episodes and padding rows (`NO_REWARD_LOGGERS`)."""
    for category, message, _why in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name in NO_REWARD_LOGGERS:
        logger = logging.getLogger(name)
        if _not_an_unscored_episode not in logger.filters:
            logger.addFilter(_not_an_unscored_episode)
