from .convert import from_roman, to_roman

__all__ = ["from_roman", "to_roman"]
