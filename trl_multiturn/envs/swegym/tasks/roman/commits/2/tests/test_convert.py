import pytest

from roman import from_roman, to_roman


def test_to_roman_examples():
    assert [to_roman(n) for n in (1, 4, 9, 14, 40, 1994, 3999)] == [
        "I", "IV", "IX", "XIV", "XL", "MCMXCIV", "MMMCMXCIX"]


def test_to_roman_range():
    with pytest.raises(ValueError):
        to_roman(0)


def test_from_roman_additive():
    assert from_roman("MDCLXVI") == 1666 and from_roman("iii") == 3


def test_from_roman_rejects_letters():
    with pytest.raises(ValueError):
        from_roman("ABC")
