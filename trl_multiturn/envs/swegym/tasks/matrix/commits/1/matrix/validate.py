"""Checks shared by the matrix operations."""


def check_rectangular(m):
    if not isinstance(m, list) or any(not isinstance(row, list) for row in m):
        raise TypeError("a matrix is a list of row lists")
    widths = {len(row) for row in m}
    if len(widths) > 1:
        raise ValueError(f"rows have different lengths: {sorted(widths)}")
