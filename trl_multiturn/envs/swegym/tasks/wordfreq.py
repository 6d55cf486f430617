from .source import Edit, TaskSource

TOKENIZE = '''\
"""Split text into words."""

import re

_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")


def tokenize(text):
    """The words of `text`, lower-cased, keeping inner apostrophes ("don't")."""
    return _WORD.findall(text)
'''

COUNTER = '''\
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
'''

INIT = '''\
from .counter import STOPWORDS, top_words, word_counts
from .tokenize import tokenize

__all__ = ["STOPWORDS", "tokenize", "top_words", "word_counts"]
'''

TESTS = '''\
from wordfreq import tokenize, top_words, word_counts


def test_tokenize_keeps_apostrophes():
    assert tokenize("don't stop, rock'n roll") == ["don't", "stop", "rock'n", "roll"]


def test_top_words_order():
    assert top_words("b a b c b c", n=2, stopwords=()) == [("b", 3), ("c", 2)]


def test_ties_alphabetical():
    assert top_words("pear fig apple", n=3) == [("apple", 1), ("fig", 1), ("pear", 1)]


def test_stopwords_dropped():
    assert "the" not in word_counts("the cat and the hat")
'''

SOURCE = TaskSource(
    name="wordfreq",
    summary="Word frequencies for short texts.",
    problem_statement='''
Word counts are case-sensitive

`tokenize` is documented to lower-case words, but it keeps their case, so a capitalised word at the start of a
sentence is counted apart from the same word elsewhere, and capitalised stopwords slip through:

```python
>>> from wordfreq import top_words
>>> top_words("The cat saw the Cat. Cats!", n=2)
[('Cat', 1), ('Cats', 1)]
```

Expected `[('cat', 2), ('cats', 1)]`: "The" is a stopword and "cat"/"Cat" are one word.
''',
    commits=(
        ("Add tokenizer", {"wordfreq/__init__.py": "from .tokenize import tokenize\n\n__all__ = [\"tokenize\"]\n",
                           "wordfreq/tokenize.py": TOKENIZE}),
        ("Add word counts", {"wordfreq/__init__.py": INIT, "wordfreq/counter.py": COUNTER,
                             "tests/test_counter.py": TESTS}),
    ),
    fix=(Edit("wordfreq/tokenize.py", "    return _WORD.findall(text)\n",
              "    return _WORD.findall(text.lower())\n"),),
    tests=(Edit("tests/test_counter.py", None, '''

def test_counts_ignore_case():
    assert top_words("The cat saw the Cat. Cats!", n=2) == [("cat", 2), ("cats", 1)]
'''),),
    fail_to_pass=("tests/test_counter.py::test_counts_ignore_case",),
    pass_to_pass=(
        "tests/test_counter.py::test_tokenize_keeps_apostrophes",
        "tests/test_counter.py::test_top_words_order",
        "tests/test_counter.py::test_ties_alphabetical",
        "tests/test_counter.py::test_stopwords_dropped",
    ),
    base_commit="adc0ccc2729a422bfd17d54d10fb475ef7320a91",
)
