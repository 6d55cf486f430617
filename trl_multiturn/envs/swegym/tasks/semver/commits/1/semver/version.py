"""Semantic versions: parsing, ordering and printing."""

import re
from functools import total_ordering

_PATTERN = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?$")


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
