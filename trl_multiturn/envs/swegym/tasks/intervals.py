from .source import Edit, TaskSource

CORE = '''\
"""Closed numeric intervals and their union."""

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Interval:
    start: float
    end: float

    def __post_init__(self):
        if self.end < self.start:
            raise ValueError(f"interval end {self.end} is before its start {self.start}")

    @property
    def length(self):
        return self.end - self.start

    def overlaps(self, other):
        return self.start <= other.end and other.start <= self.end


def merge(intervals):
    """Merge overlapping or touching intervals into a sorted list of disjoint intervals."""
    merged = []
    for current in sorted(intervals):
        if merged and current.start < merged[-1].end:
            last = merged[-1]
            merged[-1] = Interval(last.start, max(last.end, current.end))
        else:
            merged.append(current)
    return merged


def total_length(intervals):
    """Length of the union of `intervals`."""
    return sum(interval.length for interval in merge(intervals))
'''

PARSE = '''\
"""Read intervals written as "1-3, 5-8"."""

from .core import Interval


def parse_intervals(text):
    intervals = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        start, sep, end = part.partition("-")
        if not sep:
            raise ValueError(f"{part!r} is not an interval: write START-END")
        intervals.append(Interval(float(start), float(end)))
    return intervals
'''

INIT = '''\
from .core import Interval, merge, total_length
from .parse import parse_intervals

__all__ = ["Interval", "merge", "parse_intervals", "total_length"]
'''

TESTS = '''\
import pytest

from intervals import Interval, merge, total_length


def test_merge_overlapping():
    assert merge([Interval(1, 4), Interval(2, 6), Interval(8, 9)]) == [Interval(1, 6), Interval(8, 9)]


def test_merge_disjoint_sorted():
    assert merge([Interval(5, 6), Interval(1, 2)]) == [Interval(1, 2), Interval(5, 6)]


def test_total_length_counts_overlap_once():
    assert total_length([Interval(0, 10), Interval(5, 15)]) == 15


def test_reversed_interval_rejected():
    with pytest.raises(ValueError):
        Interval(3, 1)
'''

SOURCE = TaskSource(
    name="intervals",
    summary="Closed intervals on the number line: merging and total length.",
    problem_statement='''
merge() does not merge intervals that only touch

The docstring of `intervals.merge` says that overlapping *or touching* intervals are merged, but intervals that
share an endpoint stay separate:

```python
>>> from intervals import Interval, merge
>>> merge([Interval(1, 3), Interval(3, 5)])
[Interval(start=1, end=3), Interval(start=3, end=5)]
```

Expected `[Interval(start=1, end=5)]`. `total_length` is not affected, but code that counts the merged pieces is.
''',
    commits=(
        ("Add Interval and merge", {"intervals/__init__.py": INIT, "intervals/core.py": CORE,
                                    "intervals/parse.py": PARSE}),
        ("Add tests for merging", {"tests/test_core.py": TESTS}),
    ),
    fix=(Edit("intervals/core.py", "if merged and current.start < merged[-1].end:",
              "if merged and current.start <= merged[-1].end:"),),
    tests=(Edit("tests/test_core.py", None, '''

def test_merge_touching_intervals():
    assert merge([Interval(1, 3), Interval(3, 5)]) == [Interval(1, 5)]
'''),),
    fail_to_pass=("tests/test_core.py::test_merge_touching_intervals",),
    pass_to_pass=(
        "tests/test_core.py::test_merge_overlapping",
        "tests/test_core.py::test_merge_disjoint_sorted",
        "tests/test_core.py::test_total_length_counts_overlap_once",
        "tests/test_core.py::test_reversed_interval_rejected",
    ),
    base_commit="bc034a6f1ff774b487c0e51c1ebbd8abbe1e175a",
)
