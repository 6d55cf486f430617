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
