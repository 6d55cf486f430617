from .counter import STOPWORDS, top_words, word_counts
from .tokenize import tokenize

__all__ = ["STOPWORDS", "tokenize", "top_words", "word_counts"]
