import pytest

from csvline import join_line, read_table, split_line, write_table


def test_split_plain():
    assert split_line("a,b,,c") == ["a", "b", "", "c"]


def test_split_quoted_delimiter():
    assert split_line('x,"1,5",y') == ["x", "1,5", "y"]


def test_unterminated_quote():
    with pytest.raises(ValueError):
        split_line('"abc')


def test_join_quotes_delimiter():
    assert join_line(["a,b", "c"]) == '"a,b",c'


def test_table_round_trip_plain():
    rows = [{"name": "ada", "lang": "en"}, {"name": "bo", "lang": "sv"}]
    assert read_table(write_table(rows)) == rows
