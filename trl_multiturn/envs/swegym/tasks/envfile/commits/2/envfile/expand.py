"""Substitute ${NAME} references."""

import re

_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand(text, env):
    """Replace each ${NAME} in `text` by env[NAME]; unknown names raise KeyError."""
    return _REF.sub(lambda m: env[m.group(1)], text)


def load(text):
    """Parse `text` and expand references to keys defined earlier in it."""
    from .parser import parse

    env = {}
    for key, value in parse(text).items():
        env[key] = expand(value, env)
    return env
