"""Roman numerals between 1 and 3999."""

_TABLE = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
    (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
]
_VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def to_roman(number):
    if not 0 < number < 4000:
        raise ValueError(f"{number} is outside 1..3999")
    out = []
    for value, letters in _TABLE:
        count, number = divmod(number, value)
        out.append(letters * count)
    return "".join(out)


def from_roman(text):
    text = text.strip().upper()
    if not text or any(ch not in _VALUES for ch in text):
        raise ValueError(f"{text!r} is not a Roman numeral")
    return sum(_VALUES[ch] for ch in text)
