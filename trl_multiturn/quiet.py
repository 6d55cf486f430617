"""Third-party warnings and log lines a trl-multiturn user cannot act on, filtered once when the package is imported.

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
    (FutureWarning, r"`is_gradient_checkpointing` is deprecated and will be removed in v6",
     "TRL 1.16's `unwrap_model_for_generation` (trl/models/utils.py), called around every generation of a training "
     "step, reads the model's old property name on transformers 5.2x; the user's code has no say in it"),
)
KNOWN_WARNING_MODULES = {"`is_gradient_checkpointing`": r"transformers\.modeling_utils"}
"""Where a known warning must be raised for the filter to apply (a message's start -> the module regex): the
property's own `warnings.warn` in transformers, reached here only through TRL's call."""

DEEPSPEED_LOGGER = "DeepSpeed"
DEEPSPEED_CPU_NOTE = "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it."
"""DeepSpeed's accelerator detection logs this as a warning on every run without CUDA once DeepSpeed is installed
(the dev set-up's `deepspeed` extra), DeepSpeed used or not: on a CPU run it says nothing (accelerate already chose
the CPU), and on a machine whose GPU torch cannot see, torch and accelerate say so themselves."""


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


def _not_the_cpu_note(record: logging.LogRecord) -> bool:
    return record.getMessage() != DEEPSPEED_CPU_NOTE


def filter_known_warnings() -> None:
    """Ignore each of `KNOWN_WARNINGS` (added in front of the filters: they win over `-W default`; only from its
    module where `KNOWN_WARNING_MODULES` names one), TRL's "All reward functions returned None" log for our failed
    episodes and padding rows (`NO_REWARD_LOGGERS`), and DeepSpeed's `DEEPSPEED_CPU_NOTE`."""
    for category, message, _why in KNOWN_WARNINGS:
        module = next((where for start, where in KNOWN_WARNING_MODULES.items() if message.startswith(start)), "")
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name, keep in [*((name, _not_an_unscored_episode) for name in NO_REWARD_LOGGERS),
                       (DEEPSPEED_LOGGER, _not_the_cpu_note)]:
        logger = logging.getLogger(name)
        if keep not in logger.filters:
            logger.addFilter(keep)
