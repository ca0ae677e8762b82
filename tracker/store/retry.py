"""Bounded exponential-backoff retries for calls to the tracking store.

A remote MLflow server can be restarted, or a sqlite file briefly locked, while a
training job keeps running; losing metrics to such a blip would be worse than
waiting for it. Errors that retrying cannot fix (bad names, unknown runs, denied
credentials) are raised at once so a misconfiguration is not hidden for minutes.
"""

from __future__ import annotations

import errno
import logging
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

from mlflow.exceptions import MlflowException

log = logging.getLogger(__name__)

T = TypeVar("T")

# MLflow error codes that mean "the request itself is wrong": the same call would fail again.
_PERMANENT_CODES = frozenset(
    {
        "INVALID_PARAMETER_VALUE",
        "RESOURCE_DOES_NOT_EXIST",
        "RESOURCE_ALREADY_EXISTS",
        "INVALID_STATE",
        "PERMISSION_DENIED",
        "UNAUTHENTICATED",
        "BAD_REQUEST",
        "ENDPOINT_NOT_FOUND",
    }
)


# OS errors of a local artifact write that waiting cannot fix: the path is not a directory or not
# writable, or the disk (or the process's file-size limit) is full. Retrying them would block a
# checkpoint registration or an eval's results for the whole window before the same error.
# Network errors (requests' ConnectionError is an OSError too) carry other or no errno.
_PERMANENT_ERRNOS = frozenset(
    {errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.EACCES, errno.EPERM, errno.EROFS,
     errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.ENAMETOOLONG}
)


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep retrying one failed store call, and how fast.

    window_s: total time one call may keep failing before the error is raised.
    first_delay_s / max_delay_s: the backoff starts at first_delay_s and doubles up
    to max_delay_s between attempts.
    """

    window_s: float = 120.0
    first_delay_s: float = 0.5
    max_delay_s: float = 10.0


def is_transient(exc: BaseException) -> bool:
    """True when retrying the same store call may succeed (outage, lock, timeout)."""
    if isinstance(exc, MlflowException):
        return exc.error_code not in _PERMANENT_CODES
    if isinstance(exc, OSError) and exc.errno in _PERMANENT_ERRNOS:
        return False
    return isinstance(exc, Exception)


def call_with_retry(fn: Callable[[], T], policy: RetryPolicy, what: str) -> T:
    """Call fn until it succeeds, a permanent error occurs, or policy.window_s has passed."""
    deadline: float | None = None
    delay = policy.first_delay_s
    while True:
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc):
                raise
            now = time.monotonic()
            if deadline is None:
                deadline = now + policy.window_s
                log.warning("%s failed (%s); retrying for up to %.0f s", what, exc, policy.window_s)
            if now >= deadline:
                raise
            time.sleep(min(delay, deadline - now))
            delay = min(delay * 2, policy.max_delay_s)
