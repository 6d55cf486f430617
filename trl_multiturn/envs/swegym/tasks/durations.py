from .source import Edit, TaskSource

UNITS = '''\
"""Duration units, largest first."""

UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
'''

CORE = '''\
"""Read and write durations such as "1h 30m"."""

import re

from .units import UNITS

_PART = re.compile(r"(\\d+)([dhms])")


def parse_duration(text):
    """Seconds in a duration written as numbers with units d, h, m, s, e.g. "2h15m" or "1d 4h"."""
    text = text.strip().lower()
    if not re.fullmatch(r"(?:\\d+[dhms])+", text):
        raise ValueError(f"{text!r} is not a duration such as '1h 30m'")
    return sum(int(amount) * UNITS[unit] for amount, unit in _PART.findall(text))


def format_duration(seconds):
    """Write `seconds` with the largest units first, skipping zero parts: 5400 -> "1h 30m"."""
    if seconds < 0:
        raise ValueError("durations cannot be negative")
    if seconds == 0:
        return "0s"
    parts = []
    for unit, size in UNITS.items():
        amount, seconds = divmod(seconds, size)
        if amount:
            parts.append(f"{amount}{unit}")
    return " ".join(parts)
'''

INIT = '''\
from .core import format_duration, parse_duration

__all__ = ["format_duration", "parse_duration"]
'''

TESTS = '''\
import pytest

from durations import format_duration, parse_duration


def test_parse_compact():
    assert parse_duration("1h30m") == 5400
    assert parse_duration("2d") == 172800


def test_parse_rejects_garbage():
    with pytest.raises(ValueError):
        parse_duration("ten minutes")


def test_format_skips_zero_parts():
    assert format_duration(3605) == "1h 5s"


def test_format_zero():
    assert format_duration(0) == "0s"
'''

SOURCE = TaskSource(
    name="durations",
    summary="Parse and format human-readable durations.",
    problem_statement='''
parse_duration cannot read what format_duration writes

`format_duration` separates the parts with spaces, and the docstring of `parse_duration` gives "1d 4h" as an
example, but `parse_duration` rejects any whitespace between parts:

```python
>>> from durations import format_duration, parse_duration
>>> format_duration(5400)
'1h 30m'
>>> parse_duration("1h 30m")
ValueError: '1h 30m' is not a duration such as '1h 30m'
```

`parse_duration(format_duration(n)) == n` should hold for every non-negative `n`.
''',
    commits=(
        ("Add duration parsing", {"durations/__init__.py": INIT, "durations/core.py": CORE,
                                  "durations/units.py": UNITS}),
        ("Test durations", {"tests/test_core.py": TESTS}),
    ),
    fix=(Edit("durations/core.py", 'if not re.fullmatch(r"(?:\\d+[dhms])+", text):',
              'if not re.fullmatch(r"(?:\\d+[dhms]\\s*)+", text):'),),
    tests=(Edit("tests/test_core.py", None, '''

def test_parse_with_spaces():
    assert parse_duration("1d 4h") == 100800


def test_round_trip():
    for seconds in (1, 59, 61, 3605, 5400, 90061):
        assert parse_duration(format_duration(seconds)) == seconds
'''),),
    fail_to_pass=("tests/test_core.py::test_parse_with_spaces", "tests/test_core.py::test_round_trip"),
    pass_to_pass=(
        "tests/test_core.py::test_parse_compact",
        "tests/test_core.py::test_parse_rejects_garbage",
        "tests/test_core.py::test_format_skips_zero_parts",
        "tests/test_core.py::test_format_zero",
    ),
    base_commit="bd5ae093dbcb2f1ef9ddaf4aad5c32d9d8ec92b0",
)
