"""Third-party warnings a trl-multiturn user cannot act on, filtered once when the package is imported.

Each entry is one exact warning (category and the start of its message) raised by a dependency's own call into
another dependency, with the reason it says nothing to the user. Everything else is left as it is: a warning about
something the user wrote still shows.
"""

from __future__ import annotations

import warnings

KNOWN_WARNINGS = (
    (FutureWarning, r"`gradient_checkpointing(_kwargs|_enable|_disable)?` is deprecated and will be removed in v6",
     "transformers 5.2x renamed gradient checkpointing to activation checkpointing; TRL 1.16's configs (their "
     "`gradient_checkpointing` default) and trainers still use the old names, so every run warns, whatever the "
     "user sets"),
)


def filter_known_warnings() -> None:
    """Ignore each of `KNOWN_WARNINGS` (added in front of the filters: they win over `-W default`)."""
    for category, message, _why in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
