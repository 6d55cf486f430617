"""Command line: convert each argument, numbers to numerals and numerals to numbers."""

import sys

from .convert import from_roman, to_roman


def main(argv=None):
    for arg in sys.argv[1:] if argv is None else argv:
        print(to_roman(int(arg)) if arg.isdigit() else from_roman(arg))
    return 0
