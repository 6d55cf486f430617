"""Version constraints such as ">=1.2.0" and "^1.2.0"."""

from .version import Version, parse


def satisfies(version, constraint):
    version = parse(version) if isinstance(version, str) else version
    constraint = constraint.strip()
    if constraint.startswith("^"):
        low = parse(constraint[1:])
        return low <= version < Version(low.major + 1, 0, 0)
    for op in (">=", "<=", ">", "<", "=="):
        if constraint.startswith(op):
            other = parse(constraint[len(op):])
            return {
                ">=": version >= other,
                "<=": version <= other,
                ">": version > other,
                "<": version < other,
                "==": version == other,
            }[op]
    return version == parse(constraint)


def latest(versions):
    """The greatest of `versions` (strings or Version objects)."""
    return max(parse(v) if isinstance(v, str) else v for v in versions)
