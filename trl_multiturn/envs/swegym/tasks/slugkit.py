from .source import Edit, TaskSource

SLUG = '''\
"""URL slugs from arbitrary titles."""

import re
import unicodedata


def slugify(text, sep="-", max_length=None):
    """Lower-case ASCII words of `text` joined by `sep`, at most `max_length` characters long.

    The result never starts or ends with `sep` and never holds two separators in a row.
    """
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    slug = re.sub(r"[^a-z0-9]+", sep, ascii_text.lower()).strip(sep)
    if max_length is not None:
        slug = slug[:max_length]
    return slug
'''

UNIQUE = '''\
"""Slugs that do not collide with ones already taken."""

from .slug import slugify


def unique_slug(text, taken, sep="-"):
    base = slugify(text, sep=sep)
    slug, n = base, 2
    while slug in taken:
        slug = f"{base}{sep}{n}"
        n += 1
    return slug
'''

INIT_FIRST = '''\
from .slug import slugify

__all__ = ["slugify"]
'''

INIT = '''\
from .slug import slugify
from .unique import unique_slug

__all__ = ["slugify", "unique_slug"]
'''

TESTS = '''\
from slugkit import slugify, unique_slug


def test_basic():
    assert slugify("Hello, World!") == "hello-world"


def test_unicode_folded_to_ascii():
    assert slugify("Crème brûlée") == "creme-brulee"


def test_runs_of_punctuation_collapse():
    assert slugify("a -- b __ c") == "a-b-c"


def test_custom_separator():
    assert slugify("One Two", sep="_") == "one_two"


def test_unique_slug_counts_up():
    assert unique_slug("News", {"news", "news-2"}) == "news-3"
'''

SOURCE = TaskSource(
    name="slugkit",
    summary="Make URL slugs from titles.",
    problem_statement='''
slugify(max_length=...) can leave a trailing separator

When `max_length` cuts a slug right after a separator, the result ends with the separator, which the docstring
rules out:

```python
>>> from slugkit import slugify
>>> slugify("hello world again", max_length=6)
'hello-'
```

Expected `'hello'`. The same happens with a custom `sep`.
''',
    commits=(
        ("Add slugify", {"slugkit/__init__.py": INIT_FIRST, "slugkit/slug.py": SLUG}),
        ("Add unique_slug and tests", {"slugkit/__init__.py": INIT, "slugkit/unique.py": UNIQUE,
                                       "tests/test_slug.py": TESTS}),
    ),
    fix=(Edit("slugkit/slug.py", "        slug = slug[:max_length]\n",
              "        slug = slug[:max_length].rstrip(sep)\n"),),
    tests=(Edit("tests/test_slug.py", None, '''

def test_max_length_drops_trailing_separator():
    assert slugify("hello world again", max_length=6) == "hello"
    assert slugify("hello world again", sep="_", max_length=6) == "hello"
'''),),
    fail_to_pass=("tests/test_slug.py::test_max_length_drops_trailing_separator",),
    pass_to_pass=(
        "tests/test_slug.py::test_basic",
        "tests/test_slug.py::test_unicode_folded_to_ascii",
        "tests/test_slug.py::test_runs_of_punctuation_collapse",
        "tests/test_slug.py::test_custom_separator",
        "tests/test_slug.py::test_unique_slug_counts_up",
    ),
    base_commit="67b4f369be6ccd5b588c646b3109591432e3c27d",
)
