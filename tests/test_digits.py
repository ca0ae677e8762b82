"""Whole numbers in untrusted text (tracker/untrusted/digits.py)."""

from tracker.untrusted.digits import whole_number


def test_only_ascii_digits_within_the_bound_are_a_number():
    assert [whole_number(t) for t in ("0", "300", "9" * 18)] == [0, 300, 10**18 - 1]
    # str.isdigit is true for each of these; int() refuses some and misreads others
    assert [whole_number(t) for t in ("²", "٣", "1²", "9" * 19, "9" * 5000, "", "-1", " 3", "3\n", "1_0")] == [None] * 10
    assert [whole_number(t) for t in (3, None, 3.0)] == [None] * 3  # only text is read
