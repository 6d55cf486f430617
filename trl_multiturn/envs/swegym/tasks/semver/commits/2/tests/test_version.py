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
