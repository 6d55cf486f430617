from .tokenize import tokenize

__all__ = ["tokenize"]
