"""Waiting on a condition with a deadline: the tests' only way to wait (never a fixed sleep)."""

import time

import pytest


def wait_until(predicate, timeout=30.0, interval=0.02, what="condition"):
    """Poll `predicate` until it returns something truthy (returned); fail the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"{what} not met within {timeout} s")
