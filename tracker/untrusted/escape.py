"""Text from the store (run names, prompt ids, engine replies, a user's settings) made inert where
draftboard shows it outside the dashboard: a terminal, and Slack's mrkdwn (the dashboard's Markdown,
HTML and CSV: tracker/dashboard/escape.py).

- A terminal runs escape sequences: ESC [ 2 K erases the line, OSC 0 sets the window title, OSC 52
  writes the clipboard, a bare CR overwrites what was printed, bidi overrides reorder what is read.
  `terminal` shows every control character as a visible `\\xNN` / `\\uNNNN` instead (newline and tab
  stay), in one pass (`str.translate`).
- Slack reads `<!channel>`, `<@U123>` and `<https://evil|a disguised link>` in a message's text; its
  documented escaping is `&` -> `&amp;`, `<` -> `&lt;`, `>` -> `&gt;`, after which nothing in the text
  is a control sequence (`slack`).
"""

from __future__ import annotations

import sys

_CONTROLS = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), 0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F),
             *range(0x2066, 0x206A)]
_TERMINAL = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _CONTROLS if c not in (0x09, 0x0A)}
_SLACK = {ord("&"): "&amp;", ord("<"): "&lt;", ord(">"): "&gt;"}


def terminal(text: object) -> str:
    """`text` with every character a terminal would act on shown as its escape, not sent."""
    return str(text).translate(_TERMINAL)


def say(*parts: object, file=None) -> None:
    """`print` for text that holds anything from the store: terminal-safe."""
    print(terminal(" ".join(map(str, parts))), file=file or sys.stdout)


def slack(text: object) -> str:
    """`text` as Slack's mrkdwn shows it literally (no mention, channel ping or link)."""
    return terminal(str(text)).translate(_SLACK)
