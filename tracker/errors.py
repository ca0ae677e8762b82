"""The one exception type users see: its message is the `error: ...` line of the CLI."""


class DraftboardError(Exception):
    """Bad input or an unusable environment; the message says what to do about it."""
