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
