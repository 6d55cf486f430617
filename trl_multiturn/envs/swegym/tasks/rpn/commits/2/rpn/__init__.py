from .evaluator import evaluate
from .tokens import tokenize

__all__ = ["evaluate", "tokenize"]
