"""`History` policies: what a step-wise episode's model sees of the episode so far.

With `episode_format="stepwise"` every turn's context is rendered whole by the chat template from the messages a
History policy returns, and each turn is trained as its own sample (see `EpisodeRunner`). A policy is a callable

    history(opening: list[dict], turns: list[list[dict]]) -> list[dict]

`opening` holds the messages the episode starts from (system prompt, task / first observation); `turns[k]` holds
turn k's assistant reply and the observation that answered it, as chat messages. It returns the messages to render,
ending with the latest observation; the template's generation prompt is added after them.

Config spelling (`history` field): "full" (every turn), "window:K" (the last K turns verbatim), or a
"package.module:function" path to a user's own policy (e.g. one that keeps a summary).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

History = Callable[[list[dict], list[list[dict]]], list[dict]]


def full(opening: list[dict], turns: list[list[dict]]) -> list[dict]:
    """Every turn so far: the trajectory format's context, rendered whole."""
    return [*opening, *(message for turn in turns for message in turn)]


def window(k: int) -> History:
    """The opening messages and the last `k` turns verbatim (verl-agent's memory window)."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"history='window:{k}': the window holds a whole number of turns >= 1, e.g. 'window:2'")

    def last_turns(opening: list[dict], turns: list[list[dict]]) -> list[dict]:
        return full(opening, turns[-k:])

    last_turns.__name__ = f"window_{k}"
    return last_turns


def get_history(spec: str | History) -> History:
    """The policy `spec` names: "full", "window:K", a "module:function" path, or a callable (returned as is). A
    ValueError naming the field, the value and the accepted forms otherwise."""
    if callable(spec):
        return spec
    forms = "'full', 'window:K' (K >= 1 turns) or a 'package.module:function' path"
    if not isinstance(spec, str):
        raise ValueError(f"history={spec!r}: give {forms}, or a callable")
    if spec == "full":
        return full
    if spec.startswith("window:"):
        count = spec.removeprefix("window:")
        if not count.isdigit():
            raise ValueError(f"history={spec!r}: the window is a number of turns, e.g. 'window:2'")
        return window(int(count))
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"history={spec!r}: give {forms}")
    try:
        policy = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"history={spec!r}: cannot load it ({exc}); give {forms}") from None
    if not callable(policy):
        raise ValueError(f"history={spec!r} is not callable; give {forms}")
    return policy
