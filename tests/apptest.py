"""Running one dashboard page with Streamlit's AppTest, and reading what it wrote."""

import re
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[1] / "app.py")


def serve(monkeypatch, uri: str, home: Path, jobs_dir: Path, allowed_roots: Path | None = None) -> None:
    """Point the dashboard AppTest runs at store `uri` with its home, a job queue of its own in
    `jobs_dir` and file pickers limited to `allowed_roots` (unset: the defaults), read-write."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("DRAFTBOARD_HOME", str(home))
    monkeypatch.setenv("DRAFTBOARD_JOBS_URI", f"sqlite:///{jobs_dir / 'jobs.db'}")
    if allowed_roots is None:
        monkeypatch.delenv("DRAFTBOARD_ALLOWED_ROOTS", raising=False)
    else:
        monkeypatch.setenv("DRAFTBOARD_ALLOWED_ROOTS", str(allowed_roots))
    monkeypatch.delenv("DRAFTBOARD_READONLY", raising=False)


def run_page(page: str, timeout: float = 60, **query) -> AppTest:
    """Render `page` through app.py (its navigation and layout); fail on any exception."""
    at = AppTest.from_file(APP, default_timeout=timeout)
    for key, value in query.items():
        at.query_params[key] = value
    at.switch_page(page)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def shown(markdown: str) -> str:
    """Markdown as a reader sees its text: backslash escapes and the invisible word joiners
    (tracker.dashboard.escape.md) removed."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", str(markdown)).replace("\u2060", "")


def page_text(at: AppTest) -> str:
    """Everything the page wrote as text (markdown, captions, alerts, titles), as a reader sees it."""
    kinds = ("title", "subheader", "markdown", "caption", "error", "warning", "info", "success")
    return "\n".join(shown(el.value) for kind in kinds for el in getattr(at, kind))


def canvas_charts(at: AppTest, key_prefix: str) -> dict[str, dict]:
    """Chart key -> what each canvas chart (`ui.canvas_chart`) was sent to draw
    (`curve_chart.spec` or `eval_spec`)."""
    import json

    return {chart.proto.id: json.loads(chart.proto.json) for chart in at.get("bidi_component")
            if key_prefix in chart.proto.id}
