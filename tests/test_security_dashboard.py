"""Issue 10 #2 and #18: what a user wrote reaches every page as text, never as HTML, Markdown or a formula.

A store of real runs whose names, reference name, params, tags and target are attacks: an iframe
with a script, a Markdown image (fetched by every visitor's browser), a Markdown link, a bare URL,
Streamlit's own `:red[...]` directive, LaTeX and spreadsheet formulas. Every page renders it
through app.py (AppTest), and every Markdown-bearing string the page sends to the browser is
rendered here with a real CommonMark renderer (raw HTML allowed: stricter than Streamlit) to show
that no tag, image or link comes out of it, while the text itself is still shown.
"""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from markdown_it import MarkdownIt

from apptest import page_text, run_page, serve, shown
from tracker.dashboard.compare import compare_data
from tracker.dashboard.escape import WORD_JOINER, csv_bytes, csv_cell, html_text, md, md_badge, md_code
from tracker.dashboard.index import load_run_index
from tracker.dashboard.tables import runs_table

IFRAME = '<iframe srcdoc="<script>parent.document.title=\'pwned\'</script>"></iframe>'
IMAGE = "![pixel](http://attacker.example/pixel.png)"
LINK = "[click me](http://attacker.example/phish) www.attacker.example"
DIRECTIVE = ":red[alarm] $\\href{javascript:alert(1)}{x}$ **bold** `code`"
FORMULA = '=HYPERLINK("http://attacker.example","x")'
PAGES = ("pages/runs.py", "pages/compare.py", "pages/environments.py", "pages/launch.py", "pages/run_detail.py")
RENDER = MarkdownIt("commonmark", {"html": True, "linkify": False})
FORBIDDEN = re.compile(r"<(iframe|script|img|a|svg|object|embed)\b", re.I)


def fp(path: str = "fallback", dtype: str = "fp32") -> dict:
    return {
        "software": {"python": "3.11.9", "torch": "2.6.0", "transformers": "5.2.0"},
        "hardware": {"device": "cpu", "gpu_name": None, "gpu_count": 0, "cpu": "Xeon"},
        "numerics": {"dtype": dtype, "linear_attention_path": path, "attn_implementation": "sdpa"},
        "code": {"git_commit": "abc", "dirty": False},
    }


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory):
    """A training run named with an iframe, its eval named with an image in another environment,
    a reference named with a link, and formula/Markdown params, tags and target."""
    from tracker import Tracker

    home = tmp_path_factory.mktemp("hostile")
    root = home / "models"
    target = root / "target [x](http://attacker.example)"
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    (root / "prompts.jsonl").write_text('{"id": 0, "input_ids": [1, 2, 3]}\n')
    ckpt = root / "ckpt" / "step_100"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"\0" * 64)
    uri = f"sqlite:///{home / 'draftboard.db'}"
    tracker = Tracker(uri)
    ids = {}
    with tracker.training_run(IFRAME, {"lr": FORMULA, "note": IMAGE}, str(target),
                              tags={"team": IMAGE, "owner": FORMULA}, fingerprint=fp("fast", "bf16")) as train:
        for step in range(5):
            train.log_step(step, loss=1.0 / (step + 1))
        train.log_checkpoint(ckpt, 100)
    ids["train"] = train.run_id
    with tracker.eval_run(IMAGE, target=str(target), train_run_id=train.run_id, checkpoint=str(ckpt),
                          checkpoint_step=100, params={"prompts": FORMULA}, fingerprint=fp()) as ev:
        ev.log_metrics({"tau": 2.0, "accept_rate_pos1": 0.5, "ddtree_tau_b8": 2.5})
    ids["eval"] = ev.run_id
    with tracker.eval_run(LINK, target=str(target), kind="reference", reference_name=DIRECTIVE,
                          fingerprint=fp("fast")) as ref:
        ref.log_metrics({"tau": 3.0, "accept_rate_pos1": 0.7})
    ids["ref"] = ref.run_id
    with tracker.eval_run(FORMULA, target=str(target), fingerprint=fp()) as formula_eval:  # its own series
        formula_eval.log_metrics({"tau": 2.2})
    ids["formula"] = formula_eval.run_id
    return {"uri": uri, "home": home, "root": root, "ids": ids, "target": str(target),
            "prompts": str(root / "prompts.jsonl")}


@pytest.fixture
def hostile_env(hostile_store, tmp_path, monkeypatch):
    serve(monkeypatch, hostile_store["uri"], hostile_store["home"], tmp_path, allowed_roots=hostile_store["root"])
    monkeypatch.setenv("DRAFTBOARD_MLFLOW_UI_URL", "http://mlflow.example:5000")
    return hostile_store


# --------------------------------------------------------------------------- what the browser receives


# Fields that Streamlit renders as Markdown: element bodies (markdown, captions, titles, alerts,
# toasts, badges), widget and link labels, help tooltips, progress texts. Option lists and input
# values are shown as plain text and are not collected.
MARKDOWN_FIELDS = {"body", "label", "help", "text", "caption"}


def _strings(message, out: list[str]) -> list[str]:
    """The Markdown-rendered string fields of a protobuf message, nested ones included."""
    for descriptor, value in message.ListFields():
        if isinstance(value, str):
            if descriptor.name in MARKDOWN_FIELDS:
                out.append(value)
        elif hasattr(value, "ListFields"):
            _strings(value, out)
    return out


def _elements(at):
    """Every element of the rendered page (main area, sidebar, inside containers, tabs, expanders)."""
    stack = [at._tree]
    while stack:
        node = stack.pop()
        children = getattr(node, "children", None)
        if children:
            stack.extend(children.values())
        proto = getattr(node, "proto", None)
        if proto is not None:
            yield node, proto


def _check_page(at) -> dict[str, list[str]]:
    """Fail on any user text that would render as HTML or Markdown; return the strings sent, by element type."""
    sent: dict[str, list[str]] = {}
    for node, proto in _elements(at):
        kind = getattr(node, "type", type(node).__name__)
        if kind == "plotly_chart":
            spec = json.loads(proto.spec)
            names = [t.get("name", "") for t in spec["data"]] + [a.get("text", "") for a in
                                                                 spec["layout"].get("annotations", [])]
            assert not any(FORBIDDEN.search(n) for n in names), names
            sent.setdefault(kind, []).extend(names)
            continue
        if kind == "bidi_component":  # a canvas chart: names travel as data, written as text (curve_chart.js)
            assert not proto.html_content
            spec = json.loads(proto.json)
            sent.setdefault(kind, []).extend([s["name"] for s in spec["series"]]
                                             + [(spec.get("reference") or {}).get("label", "")])
            continue
        if kind in ("dataframe", "arrow_data_frame", "json", "code", "text"):
            continue  # shown as plain text cells / JSON / code by the browser
        assert not getattr(proto, "allow_html", False), f"{kind} allows raw HTML: {proto}"
        for text in _strings(proto, []):
            html = RENDER.render(text)
            assert not FORBIDDEN.search(html), (kind, text, html)
            sent.setdefault(kind, []).append(text)
    return sent


@pytest.mark.parametrize("page", PAGES)
def test_every_page_shows_user_text_escaped(hostile_env, page):
    ids = hostile_env["ids"]
    query = {"pages/run_detail.py": {"run": ids["train"]},
             "pages/compare.py": {"runs": f"{ids['train']},{ids['eval']}"}}.get(page, {})
    at = run_page(page, **query)
    sent = _check_page(at)
    assert sent, "nothing checked"
    text = page_text(at)
    if page == "pages/run_detail.py":
        assert shown(at.title[0].value) == IFRAME  # the name is there, as text
        assert f"**Critical environment difference**\n- {IFRAME} @ step 100: linear-attn fallback vs training" in text
        assert any(IMAGE in shown(label) for label in sent["page_link"])  # the eval's link, named as text
    if page == "pages/compare.py":
        assert f"{IFRAME} @ step 100 (eval): linear-attn fallback vs its training run: fast" in text
        charts = " ".join(sent.get("bidi_component", []))  # the eval charts, on a canvas: names as written
        assert IFRAME in charts or IMAGE in charts
    if page == "pages/environments.py":
        assert IFRAME in text  # "Cells differing from **<name>**", as text, with the legend beside it
        assert ":red-background[critical]" in " ".join(m.value for m in at.markdown)


def test_run_detail_of_the_eval_and_the_reference(hostile_env):
    ids = hostile_env["ids"]
    for run_id, name in ((ids["eval"], IMAGE), (ids["ref"], LINK)):
        at = run_page("pages/run_detail.py", run=run_id)
        _check_page(at)
        assert shown(at.title[0].value) == name


def test_launch_and_the_queue_show_the_run_name_escaped(hostile_env):
    from tracker.jobs.queue import JobQueue

    at = run_page("pages/launch.py")
    at.selectbox(key="launch_train_run").set_value(hostile_env["ids"]["train"]).run()
    at.selectbox(key="launch_prompt_set").set_value("__path__")
    at.selectbox(key="launch_checkpoint").set_value(100).run()
    at.text_input(key="launch_prompts").set_value(hostile_env["prompts"])  # in the form: sent with the submit
    at.button(key="launch_submit").click().run()
    assert not at.exception, [e.message for e in at.exception]
    assert len(JobQueue().list()) == 1, page_text(at)
    _check_page(at)
    assert IFRAME in page_text(at)  # the job's title names the training run, as text


# --------------------------------------------------------------------------- CSV (issue 10 #18)


def test_csv_exports_neutralise_formula_cells(hostile_env):
    from tracker import Tracker

    index = load_run_index(Tracker(hostile_env["uri"]))
    table = runs_table(index, list(index.runs.values()))
    assert FORMULA in set(table["name"])  # the table itself keeps the name as written
    exported = csv_bytes(table).decode()
    assert f"'{FORMULA}" in exported.replace('""', '"')
    assert not re.search(r"(^|,)=", exported, re.M)
    ids = hostile_env["ids"]
    data = compare_data(index, [ids["train"], ids["formula"]], ids["ref"], pd.DataFrame(
        columns=["run_id", "key", "step", "value", "timestamp"]))
    export = csv_bytes(data.export_frame()).decode()
    assert "'=HYPERLINK" in export.replace('""', '"') and not re.search(r'(^|,)"?=', export, re.M)


def test_the_pages_downloads_are_the_safe_csv(hostile_env, monkeypatch):
    """What the download buttons hand to the browser, recorded where Streamlit stores it."""
    from streamlit.runtime.media_file_manager import MediaFileManager
    from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage

    downloads: dict[str, bytes] = {}
    store = MemoryMediaFileStorage.load_and_get_id

    def recording(self, data, mimetype, kind, filename=None):
        downloads[filename] = data
        return store(self, data, mimetype, kind, filename)

    monkeypatch.setattr(MemoryMediaFileStorage, "load_and_get_id", recording)
    # A CSV written when its button is clicked (data=callable): written here as the click would.
    deferred = MediaFileManager.add_deferred

    def written_now(self, data, mimetype, coordinates, file_name=None, **kwargs):
        body = data()
        downloads[file_name] = body.encode() if isinstance(body, str) else body
        return deferred(self, data, mimetype, coordinates, file_name=file_name, **kwargs)

    monkeypatch.setattr(MediaFileManager, "add_deferred", written_now)
    ids = hostile_env["ids"]
    run_page("pages/runs.py")
    at = run_page("pages/compare.py", runs=f"{ids['train']},{ids['formula']}")
    for view in at.segmented_control(key="compare_view").options:  # one view at a time, each with its CSV
        at.segmented_control(key="compare_view").set_value(view).run()
    assert {"runs.csv", "compare.csv", "eval_by_checkpoint.csv", "training_curves.csv"} <= set(downloads)
    report = downloads.pop("draftboard-report.html").decode()  # Compare as one HTML file: names as text
    assert html_text(IFRAME) in report and "<iframe" not in report
    for name, data in downloads.items():
        text = data.decode()
        assert not re.search(r'(^|,)"?[=+@]', text, re.M), (name, text)
    assert "'=HYPERLINK" in downloads["runs.csv"].decode().replace('""', '"')


# --------------------------------------------------------------------------- the helpers themselves


@pytest.mark.parametrize("text", [IFRAME, IMAGE, LINK, DIRECTIVE, "a\nb\r\n# heading\n- item", "\\![x](y)",
                                  "<http://attacker.example>", "mail@attacker.example", "&lt;iframe&gt;"])
def test_md_renders_exactly_the_text(text):
    html = RENDER.render(md(text))
    assert not FORBIDDEN.search(html)
    # One paragraph whose text is the input (newlines folded into spaces).
    assert html.startswith("<p>") and html.count("<p>") == 1
    unescaped = re.sub(r"<[^>]+>", "", html).strip()
    import html as html_module

    # As a reader sees it: the invisible word joiners that keep bare URLs from linking left out.
    assert html_module.unescape(unescaped).replace(WORD_JOINER, "") == " ".join(re.split(r"[\r\n]+", text))


def test_md_code_and_badge_and_html_text():
    assert RENDER.render(md_code("a`b")) == "<p><code>a`b</code></p>\n"
    assert RENDER.render(md_code("`x")) == "<p><code>`x</code></p>\n"
    assert RENDER.render(md_code(IFRAME)).startswith("<p><code>&lt;iframe")
    assert "[" in md_badge("a[b]") and "\\[" not in md_badge("a[b]") and "\\(" in md_badge("a[b](c)")
    assert html_text(IFRAME).startswith("&lt;iframe srcdoc=&quot;")


def test_csv_cell_rules():
    for bad in ("=1+1", "+1", "-1", "@SUM(A1)", "\tx", "\rx"):
        assert csv_cell(bad) == "'" + bad
    for fine in ("ok", "1=1", "", None, -1.5, 3):
        assert csv_cell(fine) == fine


# The second, text-node pass of Streamlit's Markdown linkifier (mdast-util-gfm-autolink-literal,
# lib/index.js, `transformGfmAutolinkLiterals`): it runs after backslash escapes are resolved, so
# escaping alone leaves bare URLs live (issue 22, item 8). Its two patterns as written there (the
# email one's lookbehind on Unicode punctuation approximated by \W).
_GFM_URL = re.compile(r"(https?://|www(?=\.))([-.\w]+)([^ \t\r\n]*)", re.I)
_GFM_EMAIL = re.compile(r"(?:^|(?<=\s)|(?<=\W))([-.\w+]+)@([-\w]+(?:\.[-\w]+)+)")


def test_bare_urls_in_user_text_leave_nothing_for_the_second_autolink_pass():
    for name in ("www.attacker.example", "see http://attacker.example/p", "HTTPS://x.example", "mail a@attacker.example",
                 LINK):
        assert _GFM_URL.search(name) or _GFM_EMAIL.search(name)  # live before
        text = re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", md(name))  # what that pass sees: escapes resolved
        assert not _GFM_URL.search(text) and not _GFM_EMAIL.search(text), text
        assert shown(md(name)) == name  # and a reader sees the same text
