"""Word frequencies."""

from collections import Counter

from .tokenize import tokenize

STOPWORDS = frozenset({"a", "an", "and", "of", "the", "to"})


def word_counts(text, stopwords=STOPWORDS):
    return Counter(word for word in tokenize(text) if word not in stopwords)


def top_words(text, n=3, stopwords=STOPWORDS):
    """The `n` most frequent words as (word, count), ties broken alphabetically."""
    counts = word_counts(text, stopwords)
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:n]
