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
