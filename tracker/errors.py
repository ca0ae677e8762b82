"""The one exception type users see: its message is the `error: ...` line of the CLI."""

from tracker import redact


class DraftboardError(Exception):
    """Bad input or an unusable environment; the message says what to do about it.

    The message is redacted once, here (`tracker.redact.text`): every path an error takes (the
    CLI's `error:` line, a job's stored error, the dashboard's alerts) shows no URL password or
    secret `key=value`, whichever URI or library message it was built from.
    """

    def __init__(self, message: object = "", *args: object) -> None:
        super().__init__(redact.text(message), *args)
