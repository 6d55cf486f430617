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
