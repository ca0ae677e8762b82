"""A plain-Streamlit replica of dashboard pages: the elements each page drew, sent again with no store and no
dashboard code (issue 65's third page-speed target: each page at most 1.1x its replica).

Generated from the page itself, so it cannot drift from it: `record` listens to the websocket of a real visit
in Chromium, keeps every message the dashboard's server sent and writes, per page, the message setting
the page's config and the page's final element tree (a later delta at a path replaces an earlier one, as in
the browser), with the app's navigation. Served as

    streamlit run benchmarks/_replica.py -- DIR

this file calls `st.navigation` with the same pages (titles, icons, URL paths; so the same menu), and each
page's script sends its recorded messages as they are, with the same element bytes (tables' Arrow data,
charts' specs, the curve component's inline JavaScript). What is left is what any Streamlit app showing
these elements costs: Streamlit's server, websocket and browser code.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

NAVIGATION = "navigation.msg"
ROOTS = 1  # a delta path's first entry names a root container (main, sidebar, ...); below it, a block's children


def _recording(url_path: str, query: dict[str, str]) -> str:
    """The file of the page at `url_path` ("" for the default page) visited with `query` (Compare of 2 runs and
    Compare of 20 are one page, told apart by their query)."""
    key = hashlib.sha1(repr(sorted(query.items())).encode()).hexdigest()[:12]
    return f"page-{url_path or 'default'}-{key}.msg"


def _write(path: Path, msgs: list[ForwardMsg]) -> None:
    """Length-prefixed ForwardMsg bytes."""
    path.write_bytes(b"".join(struct.pack("<I", len(b)) + b for b in (m.SerializeToString() for m in msgs)))


def _read(path: Path) -> list[ForwardMsg]:
    data, msgs, at = path.read_bytes(), [], 0
    while at < len(data):
        (size,) = struct.unpack_from("<I", data, at)
        msgs.append(ForwardMsg.FromString(data[at + 4:at + 4 + size]))
        at += 4 + size
    return msgs


def final_tree(msgs: list[ForwardMsg]) -> list[ForwardMsg]:
    """The page's elements and blocks as drawn last, parents before children, siblings in order; an element
    under a path that ended as an element rather than a block (a placeholder's old content) is left out."""
    at: dict[tuple[int, ...], ForwardMsg] = {}
    for msg in msgs:
        if msg.WhichOneof("type") == "delta" and msg.delta.WhichOneof("type") in ("new_element", "add_block"):
            at[tuple(msg.metadata.delta_path)] = msg
    blocks = {path for path, msg in at.items() if msg.delta.WhichOneof("type") == "add_block"}
    return [at[path] for path in sorted(at) if len(path) == ROOTS + 1 or path[:-1] in blocks]


def record(context, url: str, predicate: str, arg, folder: Path) -> None:
    """Visit `url` in a new page of the Playwright browser `context` until `predicate(arg)` holds, keeping every
    ForwardMsg the server sent; save the page as its replica draws it."""
    msgs: list[ForwardMsg] = []
    page = context.new_page()
    page.on("websocket", lambda ws: ws.on(
        "framereceived", lambda payload: isinstance(payload, bytes) and msgs.append(ForwardMsg.FromString(payload))))
    page.goto(url)
    page.wait_for_function(predicate, arg=arg, polling="raf", timeout=300_000)
    page.close()
    config = [m for m in msgs if m.WhichOneof("type") == "page_config_changed"]
    navigation = [m for m in msgs if m.WhichOneof("type") == "navigation"]
    tree = final_tree(msgs)
    if not navigation or not tree:
        raise SystemExit(f"error: the visit of {url} sent no navigation or no elements to record")
    folder.mkdir(parents=True, exist_ok=True)
    _write(folder / NAVIGATION, navigation[-1:])
    parts = urlsplit(url)
    _write(folder / _recording(parts.path.strip("/"), dict(parse_qsl(parts.query))), config[-1:] + tree)


def serve(folder: Path) -> None:
    """The replica app: the recorded navigation's pages, each sending its recorded messages."""
    import streamlit as st
    from streamlit.runtime.scriptrunner_utils.script_run_context import enqueue_message

    @st.cache_resource
    def recorded(name: str) -> list[ForwardMsg]:
        return _read(folder / name)

    def draw(url_path: str):
        def page() -> None:  # a page not recorded (not measured) stays in the menu and draws nothing
            name = _recording(url_path, st.query_params.to_dict())
            if not (folder / name).is_file():
                return
            for msg in recorded(name):
                sent = ForwardMsg()
                sent.CopyFrom(msg)  # enqueueing stamps the message: the cached one stays as recorded
                enqueue_message(sent)
        page.__name__ = f"replica_{url_path.replace('-', '_') or 'default'}"
        return page

    st.navigation([
        st.Page(draw("" if app_page.is_default else app_page.url_pathname), title=app_page.page_name,
                icon=app_page.icon or None, url_path=app_page.url_pathname or None, default=app_page.is_default,
                visibility="hidden" if app_page.is_hidden else "visible")
        for app_page in recorded(NAVIGATION)[0].navigation.app_pages]).run()


if __name__ == "__main__":  # `streamlit run benchmarks/_replica.py -- DIR`
    serve(Path(sys.argv[1]))
