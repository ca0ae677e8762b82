"""tracker/untrusted/escape.py: store text made inert in a terminal and in Slack's mrkdwn (issue 37, finding 11:
`draftboard report` and `reconcile` printed store text raw, so a run name or prompt id could set the
window title, write the clipboard or erase the line it stood on)."""

from __future__ import annotations

import json

from test_reconcile import evals
from tracker.untrusted import escape
from tracker.cli import main

HOSTILE = "a\x1b]0;owned\x07b\x1b]52;c;ZWNobyBoaQ==\x07\x1b[2K\rc\u202eX"


def test_control_characters_are_shown_not_sent():
    assert escape.terminal(HOSTILE) == "a\\x1b]0;owned\\x07b\\x1b]52;c;ZWNobyBoaQ==\\x07\\x1b[2K\\x0dc\\u202eX"
    assert escape.terminal("tau 3.2\tok\nnext · ü") == "tau 3.2\tok\nnext · ü"  # text as written
    assert escape.slack("<!here> a & b") == "&lt;!here&gt; a &amp; b"


def test_reconcile_prints_store_text_inert(tmp_path, capsys):
    engine, offline = evals()
    engine["prompts"][0]["id"] = offline["prompts"][0]["id"] = HOSTILE
    for name, results in (("engine", engine), ("offline", offline)):
        (tmp_path / f"{name}.json").write_text(json.dumps(results))
    assert main(["reconcile", str(tmp_path / "engine.json"), str(tmp_path / "offline.json")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\x07" not in out
    assert "a\\x1b]0;owned" in out  # the id is still there to read


def test_report_prints_store_text_inert(tmp_path, capsys):
    from tracker.store.tracker import Tracker

    uri = f"sqlite:///{tmp_path / 'store.db'}"
    tracker = Tracker(uri)
    with tracker.eval_run("v2 @ 100", target="t", checkpoint=str(tmp_path)) as run:
        run.log_metrics({"tau": 2.0}, step=0)
    with tracker.eval_run(HOSTILE, target="t", kind="reference", reference_name=HOSTILE) as ref:
        ref.log_metrics({"tau": 2.5}, step=0)
    out = tmp_path / "r.html"
    assert main(["report", run.run_id, "--reference", ref.run_id, "--out", str(out), "--tracking-uri", uri]) == 0
    printed = capsys.readouterr().out
    assert "\x1b" not in printed and "\x07" not in printed and "\r" not in printed
    assert "a\\x1b]0;owned" in printed  # the reference's name, as text
