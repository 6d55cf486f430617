"""`lazy_getattr`: a module-level `__getattr__` (PEP 562) that imports a public name's module on first use, so that
importing a package stays cheap and works without the optional extras its names need."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_getattr(module_name: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """The `__getattr__` of module `module_name`: `names` maps each lazy name to the module that defines it
    (relative to `module_name`'s package when it starts with a dot)."""

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(import_module(names[name], module_name), name)
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    return __getattr__
