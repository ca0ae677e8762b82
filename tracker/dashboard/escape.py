"""Text a user wrote, made inert wherever the dashboard shows it: Markdown, HTML and CSV.

Run names, reference names, params, tags, targets, job titles and error messages reach the
page through Streamlit elements that render Markdown (st.markdown, captions, alerts, titles,
widget labels and help tooltips) and through Plotly, which renders a subset of HTML in trace
names and annotations. A name such as `![x](http://evil/p.png)` would otherwise make every
visitor's browser fetch that image, and `<iframe srcdoc=...>` would run where HTML is allowed.
CSV downloads are opened in spreadsheets, which evaluate a cell starting with `=` as a formula.

Fixed text written by draftboard itself is not escaped; only the user's part is.
"""

from __future__ import annotations

import html
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

# Every ASCII punctuation character can be backslash-escaped in CommonMark, and an escaped one is
# shown as itself. Escaping all of them leaves no link, image, HTML tag, autolink (`http\://`),
# emphasis, code span, LaTeX (`$`) or Streamlit directive (`:red[...]`) for the text to open.
_MARKDOWN_SPECIAL = re.compile(r"([!-/:-@\[-`{-~])")
_LINE_BREAKS = re.compile(r"[\r\n\t\v\f\u2028\u2029]+")
# Streamlit's Markdown (remark-gfm) links bare URLs twice: while parsing, which escapes stop, and
# again over the text nodes once escapes are resolved (mdast-util-gfm-autolink-literal's
# findAndReplace: `www.`, `http(s)://`, `name@domain`). An invisible WORD JOINER inside each of
# those three marks leaves nothing for that second pass to match, and the text reads the same.
WORD_JOINER = "\u2060"
_AUTOLINK_MARKS = re.compile(r"(?i)www(?=\.)|:(?=//)|@")
# Spreadsheets treat a cell starting with one of these as a formula (OWASP "CSV injection").
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def md(value: object) -> str:
    """`value` as Markdown that renders as exactly its text, on one line, and never as a link."""
    text = _LINE_BREAKS.sub(" ", str(value))
    text = _AUTOLINK_MARKS.sub(lambda m: m.group(0) + WORD_JOINER, text)
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text)


def md_badge(value: object) -> str:
    """`md` for an st.badge label: st.badge escapes square brackets itself, so they are left to it."""
    return md(value).replace("\\[", "[").replace("\\]", "]")


def md_code(value: object) -> str:
    """`value` as an inline code span: nothing inside is rendered, whatever backticks it holds."""
    text = _LINE_BREAKS.sub(" ", str(value))
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def html_text(value: object) -> str:
    """`value` as HTML text (for Plotly trace names, hovers and annotations)."""
    return html.escape(str(value), quote=True)


def csv_cell(value: object) -> object:
    """A text cell that a spreadsheet would run as a formula gets a leading `'`; other values pass."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def csv_bytes(frame: pd.DataFrame) -> bytes:
    """`frame` as UTF-8 CSV for a download button, text cells and headers made formula-safe."""
    safe = frame.rename(columns=lambda c: csv_cell(str(c)))
    for i, dtype in enumerate(safe.dtypes):
        if dtype.kind not in "biufc":  # numbers, such as -0.5, stay numbers
            safe.iloc[:, i] = safe.iloc[:, i].map(csv_cell)
    return safe.to_csv(index=False).encode()
