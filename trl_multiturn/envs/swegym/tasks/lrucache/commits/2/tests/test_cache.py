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
