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
