from .source import Edit, TaskSource

READER = '''\
"""Split and join one line of comma-separated values, with RFC 4180 quoting."""


def split_line(line, delimiter=","):
    fields, current, in_quotes = [], [], False
    i = 0
    while i < len(line):
        ch = line[i]
        if in_quotes:
            if ch == '"':
                in_quotes = False
            else:
                current.append(ch)
        elif ch == '"':
            in_quotes = True
        elif ch == delimiter:
            fields.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    if in_quotes:
        raise ValueError(f"unterminated quoted field in {line!r}")
    fields.append("".join(current))
    return fields


def join_line(fields, delimiter=","):
    out = []
    for field in fields:
        text = str(field)
        if delimiter in text or '"' in text or "\\n" in text:
            text = '"' + text.replace('"', '""') + '"'
        out.append(text)
    return delimiter.join(out)
'''

TABLE = '''\
"""Tables: a header line, then one record per line."""

from .reader import join_line, split_line


def read_table(text, delimiter=","):
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = split_line(lines[0], delimiter)
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        values = split_line(line, delimiter)
        if len(values) != len(header):
            raise ValueError(f"line {number} has {len(values)} fields, the header has {len(header)}")
        rows.append(dict(zip(header, values)))
    return rows


def write_table(rows, delimiter=","):
    if not rows:
        return ""
    header = list(rows[0])
    lines = [join_line(header, delimiter)]
    lines += [join_line([row[key] for key in header], delimiter) for row in rows]
    return "\\n".join(lines) + "\\n"
'''

INIT = '''\
from .reader import join_line, split_line
from .table import read_table, write_table

__all__ = ["join_line", "read_table", "split_line", "write_table"]
'''

TESTS = '''\
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
'''

SOURCE = TaskSource(
    name="csvline",
    summary="A tiny CSV line reader and writer with RFC 4180 quoting.",
    problem_statement='''
Escaped quotes inside quoted fields are lost when reading

`join_line` writes a field that contains a double quote the RFC 4180 way, doubling the quote and quoting the
field, but `split_line` does not read it back:

```python
>>> from csvline import join_line, split_line
>>> join_line(['say "hi"', "x"])
'"say ""hi""",x'
>>> split_line('"say ""hi""",x')
['say hi', 'x']
```

Expected `['say "hi"', 'x']`: inside a quoted field, `""` stands for one literal `"`. Tables written with
`write_table` therefore do not survive a round trip through `read_table` when a value holds a quote.
''',
    commits=(
        ("Add line reader and writer", {"csvline/__init__.py": INIT, "csvline/reader.py": READER}),
        ("Add tables on top of lines", {"csvline/table.py": TABLE, "tests/test_reader.py": TESTS}),
    ),
    fix=(Edit("csvline/reader.py", '''            if ch == '"':
                in_quotes = False
''', '''            if ch == '"' and line[i + 1 : i + 2] == '"':
                current.append('"')
                i += 1
            elif ch == '"':
                in_quotes = False
'''),),
    tests=(Edit("tests/test_reader.py", None, '''

def test_split_escaped_quote():
    assert split_line('"say ""hi""",x') == ['say "hi"', "x"]


def test_table_round_trip_quotes():
    rows = [{"quote": 'she said "no"', "n": "1"}]
    assert read_table(write_table(rows)) == rows
'''),),
    fail_to_pass=(
        "tests/test_reader.py::test_split_escaped_quote",
        "tests/test_reader.py::test_table_round_trip_quotes",
    ),
    pass_to_pass=(
        "tests/test_reader.py::test_split_plain",
        "tests/test_reader.py::test_split_quoted_delimiter",
        "tests/test_reader.py::test_unterminated_quote",
        "tests/test_reader.py::test_join_quotes_delimiter",
        "tests/test_reader.py::test_table_round_trip_plain",
    ),
    base_commit="aabf5f098058a1bc24b0d1f6b747254d61cc5729",
)
