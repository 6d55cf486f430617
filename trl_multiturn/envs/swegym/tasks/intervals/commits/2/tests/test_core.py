import pytest

from intervals import Interval, merge, total_length


def test_merge_overlapping():
    assert merge([Interval(1, 4), Interval(2, 6), Interval(8, 9)]) == [Interval(1, 6), Interval(8, 9)]


def test_merge_disjoint_sorted():
    assert merge([Interval(5, 6), Interval(1, 2)]) == [Interval(1, 2), Interval(5, 6)]


def test_total_length_counts_overlap_once():
    assert total_length([Interval(0, 10), Interval(5, 15)]) == 15


def test_reversed_interval_rejected():
    with pytest.raises(ValueError):
        Interval(3, 1)
