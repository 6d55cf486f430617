from .source import Edit, TaskSource

VERSION = '''\
"""Semantic versions: parsing, ordering and printing."""

import re
from functools import total_ordering

_PATTERN = re.compile(r"^(\\d+)\\.(\\d+)\\.(\\d+)(?:-([0-9A-Za-z.-]+))?$")


@total_ordering
class Version:
    def __init__(self, major, minor, patch, prerelease=""):
        self.major, self.minor, self.patch, self.prerelease = major, minor, patch, prerelease

    def _key(self):
        return (self.major, self.minor, self.patch, self.prerelease)

    def __eq__(self, other):
        return isinstance(other, Version) and self._key() == other._key()

    def __lt__(self, other):
        return self._key() < other._key()

    def __hash__(self):
        return hash(self._key())

    def __str__(self):
        text = f"{self.major}.{self.minor}.{self.patch}"
        return f"{text}-{self.prerelease}" if self.prerelease else text

    def __repr__(self):
        return f"Version({str(self)!r})"


def parse(text):
    match = _PATTERN.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a semantic version (MAJOR.MINOR.PATCH[-PRERELEASE])")
    major, minor, patch, prerelease = match.groups()
    return Version(int(major), int(minor), int(patch), prerelease or "")
'''

RANGES = '''\
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
'''

INIT = '''\
from .ranges import latest, satisfies
from .version import Version, parse

__all__ = ["Version", "latest", "parse", "satisfies"]
'''

TESTS = '''\
import pytest

from semver import Version, latest, parse, satisfies


def test_parse_fields():
    v = parse("1.2.3-beta.1")
    assert (v.major, v.minor, v.patch, v.prerelease) == (1, 2, 3, "beta.1")


def test_parse_rejects_garbage():
    with pytest.raises(ValueError):
        parse("1.2")


def test_numeric_ordering():
    assert parse("1.10.0") > parse("1.9.0")


def test_str_round_trip():
    assert str(parse("2.0.1-rc.2")) == "2.0.1-rc.2"


def test_caret_constraint():
    assert satisfies("1.4.0", "^1.2.0") and not satisfies("2.0.0", "^1.2.0")
'''

SOURCE = TaskSource(
    name="semver",
    summary="Parse, compare and constrain semantic versions.",
    problem_statement='''
Pre-releases sort after the release they precede

Semantic Versioning says a pre-release has lower precedence than the release: `1.0.0-alpha < 1.0.0`. Here it is
the other way round, because the empty pre-release string of a release compares smaller than any tag:

```python
>>> from semver import parse, latest
>>> parse("1.0.0-alpha") < parse("1.0.0")
False
>>> latest(["1.0.0", "1.0.0-rc.1"])
Version('1.0.0-rc.1')
```

`latest` should pick `1.0.0` here, and a constraint such as `<1.0.0` should accept `1.0.0-rc.1`.
''',
    commits=(
        ("Add Version parsing and ordering", {"semver/__init__.py": INIT, "semver/version.py": VERSION,
                                              "semver/ranges.py": RANGES}),
        ("Test parsing and constraints", {"tests/test_version.py": TESTS}),
    ),
    fix=(Edit("semver/version.py", "        return (self.major, self.minor, self.patch, self.prerelease)\n",
              "        # a release (no pre-release tag) ranks above every pre-release of the same version\n"
              "        return (self.major, self.minor, self.patch, not self.prerelease, self.prerelease)\n"),),
    tests=(Edit("tests/test_version.py", None, '''

def test_prerelease_precedes_release():
    assert parse("1.0.0-alpha") < parse("1.0.0")


def test_latest_prefers_release():
    assert latest(["1.0.0", "1.0.0-rc.1"]) == Version(1, 0, 0)
'''),),
    fail_to_pass=(
        "tests/test_version.py::test_prerelease_precedes_release",
        "tests/test_version.py::test_latest_prefers_release",
    ),
    pass_to_pass=(
        "tests/test_version.py::test_parse_fields",
        "tests/test_version.py::test_parse_rejects_garbage",
        "tests/test_version.py::test_numeric_ordering",
        "tests/test_version.py::test_str_round_trip",
        "tests/test_version.py::test_caret_constraint",
    ),
    base_commit="c0525463b58658738ea8efabd7dd1f1edadeb4c4",
)
