from .source import Edit, TaskSource

PARSER = '''\
"""Read .env files: KEY=VALUE lines, comments, blank lines, optional `export` and quotes."""


def parse(text):
    env = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        if "=" not in line:
            raise ValueError(f"line {number}: expected KEY=VALUE, got {raw!r}")
        key, value = line.split("=")
        key, value = key.strip(), value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\\"'":
            value = value[1:-1]
        env[key] = value
    return env
'''

EXPAND = '''\
"""Substitute ${NAME} references."""

import re

_REF = re.compile(r"\\$\\{([A-Za-z_][A-Za-z0-9_]*)\\}")


def expand(text, env):
    """Replace each ${NAME} in `text` by env[NAME]; unknown names raise KeyError."""
    return _REF.sub(lambda m: env[m.group(1)], text)


def load(text):
    """Parse `text` and expand references to keys defined earlier in it."""
    from .parser import parse

    env = {}
    for key, value in parse(text).items():
        env[key] = expand(value, env)
    return env
'''

INIT = '''\
from .expand import expand, load
from .parser import parse

__all__ = ["expand", "load", "parse"]
'''

TESTS = '''\
import pytest

from envfile import expand, load, parse


def test_basic_pairs():
    assert parse("A=1\\nB = two\\n") == {"A": "1", "B": "two"}


def test_comments_and_blank_lines():
    assert parse("# comment\\n\\nA=1\\n") == {"A": "1"}


def test_quotes_and_export():
    assert parse("export NAME=\\"Ada Lovelace\\"\\nX='y'") == {"NAME": "Ada Lovelace", "X": "y"}


def test_missing_equals_sign():
    with pytest.raises(ValueError):
        parse("JUSTAKEY")


def test_load_expands_earlier_keys():
    assert load("HOST=db\\nURL=postgres://${HOST}/app") == {"HOST": "db", "URL": "postgres://db/app"}
    assert expand("${A}-${A}", {"A": "x"}) == "x-x"
'''

SOURCE = TaskSource(
    name="envfile",
    summary="Read .env files with comments, quotes, `export` and ${VAR} expansion.",
    problem_statement='''
Values containing "=" crash the parser

Any value with an equals sign in it, such as a URL with a query string or base64 padding, makes `parse` fail:

```python
>>> from envfile import parse
>>> parse("DATABASE_URL=postgres://db/app?sslmode=require")
ValueError: too many values to unpack (expected 2)
```

Only the first "=" separates the key from the value; expected
`{"DATABASE_URL": "postgres://db/app?sslmode=require"}`.
''',
    commits=(
        ("Add .env parser", {"envfile/__init__.py": "from .parser import parse\n\n__all__ = [\"parse\"]\n",
                             "envfile/parser.py": PARSER}),
        ("Add ${VAR} expansion", {"envfile/__init__.py": INIT, "envfile/expand.py": EXPAND,
                                  "tests/test_parser.py": TESTS}),
    ),
    fix=(Edit("envfile/parser.py", '        key, value = line.split("=")\n',
              '        key, value = line.split("=", 1)\n'),),
    tests=(Edit("tests/test_parser.py", None, '''

def test_value_with_equals_signs():
    assert parse("DATABASE_URL=postgres://db/app?sslmode=require\\nKEY=YWJj==") == {
        "DATABASE_URL": "postgres://db/app?sslmode=require",
        "KEY": "YWJj==",
    }
'''),),
    fail_to_pass=("tests/test_parser.py::test_value_with_equals_signs",),
    pass_to_pass=(
        "tests/test_parser.py::test_basic_pairs",
        "tests/test_parser.py::test_comments_and_blank_lines",
        "tests/test_parser.py::test_quotes_and_export",
        "tests/test_parser.py::test_missing_equals_sign",
        "tests/test_parser.py::test_load_expands_earlier_keys",
    ),
    base_commit="3d93f1f9e232d36d4a9632b133d93c59d06146b4",
)
