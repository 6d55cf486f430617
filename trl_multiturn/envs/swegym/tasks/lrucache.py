from .source import Edit, TaskSource

CACHE = '''\
"""A least-recently-used cache."""

from collections import OrderedDict

_MISSING = object()


class LRUCache:
    """Holds at most `capacity` entries; when full, storing a new key evicts the least recently used one.

    Both `get` and `put` count as a use of the key.
    """

    def __init__(self, capacity):
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._data = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key, default=None):
        value = self._data.get(key, _MISSING)
        if value is _MISSING:
            self.misses += 1
            return default
        self.hits += 1
        return value

    def put(self, key, value):
        if key in self._data:
            self._data.move_to_end(key)
        self._data[key] = value
        if len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def __contains__(self, key):
        return key in self._data

    def __len__(self):
        return len(self._data)
'''

MEMO = '''\
"""Memoize a one-argument function with an LRU cache."""

import functools

from .cache import LRUCache


def memoize(maxsize=128):
    def decorate(func):
        cache = LRUCache(maxsize)

        @functools.wraps(func)
        def wrapper(arg):
            if arg in cache:
                return cache.get(arg)
            value = func(arg)
            cache.put(arg, value)
            return value

        wrapper.cache = cache
        return wrapper

    return decorate
'''

INIT = '''\
from .cache import LRUCache
from .memo import memoize

__all__ = ["LRUCache", "memoize"]
'''

TESTS = '''\
import pytest

from lrucache import LRUCache, memoize


def test_put_then_get():
    cache = LRUCache(2)
    cache.put("a", 1)
    assert cache.get("a") == 1 and cache.get("zzz", 0) == 0
    assert (cache.hits, cache.misses) == (1, 1)


def test_evicts_oldest_insert():
    cache = LRUCache(2)
    for key in "abc":
        cache.put(key, key.upper())
    assert "a" not in cache and len(cache) == 2


def test_capacity_must_be_positive():
    with pytest.raises(ValueError):
        LRUCache(0)


def test_memoize_calls_once_per_argument():
    calls = []

    @memoize(maxsize=4)
    def square(x):
        calls.append(x)
        return x * x

    assert [square(3), square(3), square(4)] == [9, 9, 16]
    assert calls == [3, 4]
'''

SOURCE = TaskSource(
    name="lrucache",
    summary="A least-recently-used cache and a memoizing decorator built on it.",
    problem_statement='''
LRUCache evicts recently read keys

`LRUCache.get` does not count as a use of the key, although the class docstring says it does, so the cache
behaves like a FIFO for keys that are only read:

```python
>>> from lrucache import LRUCache
>>> cache = LRUCache(2)
>>> cache.put("a", 1); cache.put("b", 2)
>>> cache.get("a")
1
>>> cache.put("c", 3)
>>> "a" in cache, "b" in cache
(False, True)
```

Expected `(True, False)`: "b" is the least recently used key when "c" arrives.
''',
    commits=(
        ("Add LRUCache", {"lrucache/__init__.py": "from .cache import LRUCache\n\n__all__ = [\"LRUCache\"]\n",
                          "lrucache/cache.py": CACHE}),
        ("Add memoize decorator", {"lrucache/__init__.py": INIT, "lrucache/memo.py": MEMO,
                                   "tests/test_cache.py": TESTS}),
    ),
    fix=(Edit("lrucache/cache.py", '''        self.hits += 1
        return value
''', '''        self.hits += 1
        self._data.move_to_end(key)
        return value
'''),),
    tests=(Edit("tests/test_cache.py", None, '''

def test_get_refreshes_recency():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.get("a")
    cache.put("c", 3)
    assert "a" in cache and "b" not in cache
'''),),
    fail_to_pass=("tests/test_cache.py::test_get_refreshes_recency",),
    pass_to_pass=(
        "tests/test_cache.py::test_put_then_get",
        "tests/test_cache.py::test_evicts_oldest_insert",
        "tests/test_cache.py::test_capacity_must_be_positive",
        "tests/test_cache.py::test_memoize_calls_once_per_argument",
    ),
    base_commit="4538f92d689b4f6748acfc2b2d00e8e9aee21e01",
)
