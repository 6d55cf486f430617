from .source import Edit, TaskSource

TOKENS = '''\
"""Tokens of a reverse-Polish expression."""

OPERATORS = ("+", "-", "*", "/")


def tokenize(expression):
    tokens = []
    for word in expression.split():
        if word in OPERATORS:
            tokens.append(word)
            continue
        try:
            tokens.append(float(word) if "." in word else int(word))
        except ValueError:
            raise ValueError(f"unknown token {word!r}") from None
    return tokens
'''

EVALUATOR = '''\
"""Evaluate reverse-Polish expressions: "3 4 -" is 3 - 4."""

import operator

from .tokens import tokenize

_APPLY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def evaluate(expression):
    stack = []
    for token in tokenize(expression):
        if token in _APPLY:
            if len(stack) < 2:
                raise ValueError(f"{token!r} needs two operands")
            a = stack.pop()
            b = stack.pop()
            stack.append(_APPLY[token](a, b))
        else:
            stack.append(token)
    if len(stack) != 1:
        raise ValueError(f"expression leaves {len(stack)} values on the stack")
    return stack[0]
'''

INIT = '''\
from .evaluator import evaluate
from .tokens import tokenize

__all__ = ["evaluate", "tokenize"]
'''

TESTS = '''\
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
'''

SOURCE = TaskSource(
    name="rpn",
    summary="A reverse-Polish-notation calculator.",
    problem_statement='''
Subtraction and division use the operands in the wrong order

In reverse-Polish notation "3 4 -" means 3 - 4, as the module docstring says, but the evaluator computes 4 - 3:

```python
>>> from rpn import evaluate
>>> evaluate("3 4 -")
1
>>> evaluate("8 2 /")
0.25
```

Expected -1 and 4.0. Addition and multiplication hide the problem because they commute.
''',
    commits=(
        ("Add tokenizer", {"rpn/tokens.py": TOKENS}),
        ("Add evaluator and tests", {"rpn/__init__.py": INIT, "rpn/evaluator.py": EVALUATOR,
                                     "tests/test_evaluator.py": TESTS}),
    ),
    fix=(Edit("rpn/evaluator.py", '''            a = stack.pop()
            b = stack.pop()
''', '''            b = stack.pop()
            a = stack.pop()
'''),),
    tests=(Edit("tests/test_evaluator.py", None, '''

def test_subtraction_order():
    assert evaluate("3 4 -") == -1


def test_division_order():
    assert evaluate("8 2 /") == 4.0
'''),),
    fail_to_pass=("tests/test_evaluator.py::test_subtraction_order", "tests/test_evaluator.py::test_division_order"),
    pass_to_pass=(
        "tests/test_evaluator.py::test_tokenize_numbers_and_operators",
        "tests/test_evaluator.py::test_addition_and_multiplication",
        "tests/test_evaluator.py::test_stack_underflow",
        "tests/test_evaluator.py::test_unknown_token",
    ),
    base_commit="06dec49a2c9d06fb5670b54ec12595680a72ac51",
)
