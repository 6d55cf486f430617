"""`Registry`: the one way a name in a config picks a function (advantage estimators, value estimators, action
parsers).

    ESTIMATORS = Registry("advantage_estimator")

    @ESTIMATORS.register("grpo")
    def grpo(batch, **options): ...

    ESTIMATORS.lookup(args.advantage_estimator)   # ValueError naming the field and every registered choice

A registry is a read-only mapping (`name in registry`, `registry[name]`, `sorted(registry)`); entries are only
added through `register`, which refuses a name that is already taken, so a plugin cannot silently replace a
built-in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

from .config_checks import did_you_mean

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Named entries for the config field `field` (e.g. "advantage_estimator"); `takes` phrases the choices in the
    lookup error ("choose one of" by default)."""

    def __init__(self, field: str, takes: str = "choose one of"):
        self.field = field
        self.takes = takes
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: add the decorated object under `name` and return it unchanged."""

        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.field}: {name!r} is already registered ({self._entries[name]!r}); "
                                 "register under another name")
            self._entries[name] = entry
            return entry

        return add

    def lookup(self, name: str) -> T:
        """The entry registered under `name`; a ValueError naming the field and the registered names otherwise."""
        if name not in self._entries:
            raise ValueError(f"{self.field}={name!r}: {self.takes} {sorted(self._entries)}"
                             f"{did_you_mean(name, self._entries)}")
        return self._entries[name]

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.field!r}, {sorted(self._entries)})"
