"""Read and write durations such as "1h 30m"."""

import re

from .units import UNITS

_PART = re.compile(r"(\d+)([dhms])")


def parse_duration(text):
    """Seconds in a duration written as numbers with units d, h, m, s, e.g. "2h15m" or "1d 4h"."""
    text = text.strip().lower()
    if not re.fullmatch(r"(?:\d+[dhms])+", text):
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
