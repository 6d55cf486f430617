from .core import Interval, merge, total_length
from .parse import parse_intervals

__all__ = ["Interval", "merge", "parse_intervals", "total_length"]
