from .source import Edit, TaskSource

OPS = '''\
"""Matrices as lists of rows."""

from .validate import check_rectangular


def shape(m):
    check_rectangular(m)
    return (len(m), len(m[0]) if m else 0)


def identity(n):
    return [[1 if i == j else 0 for j in range(n)] for i in range(n)]


def transpose(m):
    """The transpose of `m`: an r x c matrix becomes c x r."""
    check_rectangular(m)
    return [[m[j][i] for j in range(len(m))] for i in range(len(m))]


def multiply(a, b):
    rows_a, cols_a = shape(a)
    rows_b, cols_b = shape(b)
    if cols_a != rows_b:
        raise ValueError(f"cannot multiply {rows_a}x{cols_a} by {rows_b}x{cols_b}")
    columns = transpose(b)
    return [[sum(x * y for x, y in zip(row, col)) for col in columns] for row in a]
'''

VALIDATE = '''\
"""Checks shared by the matrix operations."""


def check_rectangular(m):
    if not isinstance(m, list) or any(not isinstance(row, list) for row in m):
        raise TypeError("a matrix is a list of row lists")
    widths = {len(row) for row in m}
    if len(widths) > 1:
        raise ValueError(f"rows have different lengths: {sorted(widths)}")
'''

INIT = '''\
from .ops import identity, multiply, shape, transpose

__all__ = ["identity", "multiply", "shape", "transpose"]
'''

TESTS = '''\
import pytest

from matrix import identity, multiply, shape, transpose


def test_shape():
    assert shape([[1, 2, 3], [4, 5, 6]]) == (2, 3)


def test_ragged_rows_rejected():
    with pytest.raises(ValueError):
        shape([[1, 2], [3]])


def test_transpose_square():
    assert transpose([[1, 2], [3, 4]]) == [[1, 3], [2, 4]]


def test_multiply_by_identity():
    m = [[2, 3], [4, 5]]
    assert multiply(m, identity(2)) == m
'''

SOURCE = TaskSource(
    name="matrix",
    summary="Small dense-matrix helpers on lists of lists.",
    problem_statement='''
transpose() is wrong for non-square matrices, which breaks multiply()

```python
>>> from matrix import transpose, multiply
>>> transpose([[1, 2, 3], [4, 5, 6]])
[[1, 4], [2, 5]]
```

The third column is dropped; expected `[[1, 4], [2, 5], [3, 6]]`. Because `multiply` transposes its right
operand, multiplying a 2x2 matrix by a 2x3 one also returns a 2x2 result instead of 2x3.
''',
    commits=(
        ("Add matrix validation", {"matrix/validate.py": VALIDATE}),
        ("Add matrix operations", {"matrix/__init__.py": INIT, "matrix/ops.py": OPS, "tests/test_ops.py": TESTS}),
    ),
    fix=(Edit("matrix/ops.py", "    return [[m[j][i] for j in range(len(m))] for i in range(len(m))]\n",
              "    rows, cols = shape(m)\n    return [[m[j][i] for j in range(rows)] for i in range(cols)]\n"),),
    tests=(Edit("tests/test_ops.py", None, '''

def test_transpose_rectangular():
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_multiply_rectangular():
    assert multiply([[1, 0], [0, 1]], [[1, 2, 3], [4, 5, 6]]) == [[1, 2, 3], [4, 5, 6]]
'''),),
    fail_to_pass=("tests/test_ops.py::test_transpose_rectangular", "tests/test_ops.py::test_multiply_rectangular"),
    pass_to_pass=(
        "tests/test_ops.py::test_shape",
        "tests/test_ops.py::test_ragged_rows_rejected",
        "tests/test_ops.py::test_transpose_square",
        "tests/test_ops.py::test_multiply_by_identity",
    ),
    base_commit="e99fdd8d4a6cbed7d9ca3d48cb6db3b0a4b0ba4a",
)
