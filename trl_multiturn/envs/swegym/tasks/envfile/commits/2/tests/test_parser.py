import pytest

from envfile import expand, load, parse


def test_basic_pairs():
    assert parse("A=1\nB = two\n") == {"A": "1", "B": "two"}


def test_comments_and_blank_lines():
    assert parse("# comment\n\nA=1\n") == {"A": "1"}


def test_quotes_and_export():
    assert parse("export NAME=\"Ada Lovelace\"\nX='y'") == {"NAME": "Ada Lovelace", "X": "y"}


def test_missing_equals_sign():
    with pytest.raises(ValueError):
        parse("JUSTAKEY")


def test_load_expands_earlier_keys():
    assert load("HOST=db\nURL=postgres://${HOST}/app") == {"HOST": "db", "URL": "postgres://db/app"}
    assert expand("${A}-${A}", {"A": "x"}) == "x-x"
