import pytest

from rpn import evaluate, tokenize


def test_tokenize_numbers_and_operators():
    assert tokenize("1 2.5 +") == [1, 2.5, "+"]


def test_addition_and_multiplication():
    assert evaluate("2 3 + 4 *") == 20


def test_stack_underflow():
    with pytest.raises(ValueError):
        evaluate("1 +")


def test_unknown_token():
    with pytest.raises(ValueError):
        evaluate("1 2 ^")
