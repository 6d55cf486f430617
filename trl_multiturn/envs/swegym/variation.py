"""How a draft of a test changes a value: `changed` for a constant of the test's text (`observe.py`, when it writes
the drafts), `varied` for a value the test receives only when it runs (a fixture's, a parametrize row's: the
runner's `__varied__`, `pytest_runner.py`). One rule for both, so an input is changed alike wherever it was bound.

Standard library only: grading copies this file into the sandbox beside the runner, which imports nothing of
trl_multiturn. Pure and deterministic: the same value and seed give the same change in the patch's run and in the
gold patch's, whose values grading compares.
"""

from __future__ import annotations

import random
import string

_ALPHABET = string.ascii_lowercase + string.digits
_KINDS = (string.digits, string.ascii_lowercase, string.ascii_uppercase)  # what a draft swaps a character within
_CONTAINERS = (list, tuple, dict)  # exactly these types (not a namedtuple or another subclass: the package's)
_DEPTH = 20  # levels of containers a leaf is looked for in


def changed(value, rng: random.Random):
    """`value` (an int, float or str) changed a little: a number by a small step; a str by one of its letters or
    digits replaced with another of the same kind (digit, lower- or upper-case letter: `"3 4 -"` -> `"3 7 -"`),
    drawn from the str's own ones where it uses three or more of that kind (`"MCMXCIV"` -> `"MCMXCIX"`: an alphabet
    of its own, such as a numeral's or a DNA string's), so the draft keeps the input's shape (separators, operators,
    length, alphabet) and is still an input of the kind the test gave. A character of another kind, inserted or
    deleted, mostly made an input that every version of the code rejects alike (`"3 x -"`, `"34 -"`), whose answer
    tells nothing: a special case of the issue's own example then passed most drafts. A str with no letter or digit
    gets one inserted."""
    if isinstance(value, int):
        return value + rng.choice((1, -1, 2, -2))
    if isinstance(value, float):
        return value + rng.choice((0.5, -0.5, 1.5))
    spots = [(i, kind) for i, c in enumerate(value) for kind in _KINDS if c in kind]
    if not spots:
        i = rng.randrange(len(value) + 1)
        return value[:i] + rng.choice(_ALPHABET) + value[i:]
    i, kind = rng.choice(spots)
    own = {c for c in value if c in kind}
    pool = own if len(own) >= 3 else set(kind)  # an alphabet of the input's own (`MCMXCIV`, `ACGT`) is kept
    return value[:i] + rng.choice(sorted(pool - {value[i]})) + value[i + 1:]


def _leaves(value, path: tuple = (), depth: int = 0):
    """The paths (keys and indexes) to the int, float and str leaves of `value`: itself, or the items of its lists
    and tuples and the values of its dicts, in order (a dict's insertion order, the same in both runs)."""
    kind = type(value)
    if kind in (int, float, str):
        yield path
    elif kind in _CONTAINERS and depth < _DEPTH:
        items = value.items() if kind is dict else enumerate(value)
        for key, item in items:
            yield from _leaves(item, (*path, key), depth + 1)


def _replaced(value, path: tuple, leaf):
    """A copy of `value` with the leaf at `path` replaced by `leaf`: the containers on the way copied, the rest
    shared."""
    if not path:
        return leaf
    key, rest = path[0], path[1:]
    if type(value) is dict:
        return {**value, key: _replaced(value[key], rest, leaf)}
    items = list(value)
    items[key] = _replaced(items[key], rest, leaf)
    return items if type(value) is list else tuple(items)


def varied(value, seed: int):
    """`value` with one of its int, float or str leaves (itself, or an item of its lists, tuples and dict values,
    at any depth up to `_DEPTH`; a str with a letter or digit, or a number, where it has one) changed by `changed`,
    the leaf and the change drawn by `seed`. LookupError where it
    has none (an object the test works on, `tmp_path`, None): that draft is not run."""
    leaves = {path: _at(value, path) for path in _leaves(value)}
    if not leaves:
        raise LookupError(f"no int, float or str to change in a {type(value).__qualname__}")
    # a number, or a str with a letter or digit, where there is one: as `changed` keeps to those within a str, a
    # separator or operator alone (`"-"` of `["3", "4", "-"]`) changes into an input every version rejects alike
    telling = [path for path, leaf in leaves.items() if type(leaf) is not str or any(
        c in kind for c in leaf for kind in _KINDS)]
    rng = random.Random(seed)
    path = rng.choice(telling or list(leaves))
    return _replaced(value, path, changed(leaves[path], rng))


def _at(value, path: tuple):
    for key in path:
        value = value[key]
    return value
