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
