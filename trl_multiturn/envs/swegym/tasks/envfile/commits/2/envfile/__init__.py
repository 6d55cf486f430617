from .expand import expand, load
from .parser import parse

__all__ = ["expand", "load", "parse"]
