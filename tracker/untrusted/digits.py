"""Whole numbers in text from outside (a tag, a version string, a JSON key, a flag's value).

`str.isdigit` is true for `²` and `٣`, which `int` refuses or reads as another number, and for 5,000
digits, which `int` refuses past Python's limit or spends quadratic time on: a check with `isdigit`
then `int` turns someone's text into a traceback. Here a number is ASCII digits only, bounded.
"""

from __future__ import annotations

MAX_DIGITS = 18  # a step, a count, a version piece: nothing draftboard reads needs more


def whole_number(text: object, max_digits: int = MAX_DIGITS) -> int | None:
    """`text` as a whole number >= 0 when it is 1..max_digits ASCII digits; None otherwise."""
    if not isinstance(text, str) or not 0 < len(text) <= max_digits or not (text.isascii() and text.isdigit()):
        return None
    return int(text)
