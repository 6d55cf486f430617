from .source import Edit, TaskSource

CONVERT = '''\
"""Roman numerals between 1 and 3999."""

_TABLE = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
    (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
]
_VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def to_roman(number):
    if not 0 < number < 4000:
        raise ValueError(f"{number} is outside 1..3999")
    out = []
    for value, letters in _TABLE:
        count, number = divmod(number, value)
        out.append(letters * count)
    return "".join(out)


def from_roman(text):
    text = text.strip().upper()
    if not text or any(ch not in _VALUES for ch in text):
        raise ValueError(f"{text!r} is not a Roman numeral")
    return sum(_VALUES[ch] for ch in text)
'''

CLI = '''\
"""Command line: convert each argument, numbers to numerals and numerals to numbers."""

import sys

from .convert import from_roman, to_roman


def main(argv=None):
    for arg in sys.argv[1:] if argv is None else argv:
        print(to_roman(int(arg)) if arg.isdigit() else from_roman(arg))
    return 0
'''

INIT = '''\
from .convert import from_roman, to_roman

__all__ = ["from_roman", "to_roman"]
'''

TESTS = '''\
import pytest

from roman import from_roman, to_roman


def test_to_roman_examples():
    assert [to_roman(n) for n in (1, 4, 9, 14, 40, 1994, 3999)] == [
        "I", "IV", "IX", "XIV", "XL", "MCMXCIV", "MMMCMXCIX"]


def test_to_roman_range():
    with pytest.raises(ValueError):
        to_roman(0)


def test_from_roman_additive():
    assert from_roman("MDCLXVI") == 1666 and from_roman("iii") == 3


def test_from_roman_rejects_letters():
    with pytest.raises(ValueError):
        from_roman("ABC")
'''

SOURCE = TaskSource(
    name="roman",
    summary="Convert between integers and Roman numerals.",
    problem_statement='''
from_roman ignores subtractive notation

`to_roman` writes 4 as "IV" and 1994 as "MCMXCIV", but `from_roman` adds every letter:

```python
>>> from roman import from_roman
>>> from_roman("IV")
6
>>> from_roman("MCMXCIV")
2216
```

A letter followed by a larger one must be subtracted (IV = 4, MCMXCIV = 1994), so that
`from_roman(to_roman(n)) == n` for all n in 1..3999.
''',
    commits=(
        ("Add conversions", {"roman/__init__.py": INIT, "roman/convert.py": CONVERT}),
        ("Add command line and tests", {"roman/cli.py": CLI, "tests/test_convert.py": TESTS}),
    ),
    fix=(Edit("roman/convert.py", "    return sum(_VALUES[ch] for ch in text)\n", '''    total = 0
    for i, ch in enumerate(text):
        value = _VALUES[ch]
        if i + 1 < len(text) and value < _VALUES[text[i + 1]]:
            total -= value
        else:
            total += value
    return total
'''),),
    tests=(Edit("tests/test_convert.py", None, '''

def test_from_roman_subtractive():
    assert from_roman("IV") == 4 and from_roman("MCMXCIV") == 1994


def test_round_trip():
    assert all(from_roman(to_roman(n)) == n for n in range(1, 4000))
'''),),
    fail_to_pass=("tests/test_convert.py::test_from_roman_subtractive", "tests/test_convert.py::test_round_trip"),
    pass_to_pass=(
        "tests/test_convert.py::test_to_roman_examples",
        "tests/test_convert.py::test_to_roman_range",
        "tests/test_convert.py::test_from_roman_additive",
        "tests/test_convert.py::test_from_roman_rejects_letters",
    ),
    base_commit="8709c8ff6d943c3535e774c68d8d8af4c8ef362a",
)
