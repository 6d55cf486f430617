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
