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
