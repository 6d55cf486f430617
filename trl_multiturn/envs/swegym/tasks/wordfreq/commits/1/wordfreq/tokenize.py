"""Split text into words."""

import re

_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")


def tokenize(text):
    """The words of `text`, lower-cased, keeping inner apostrophes ("don't")."""
    return _WORD.findall(text)
