"""Run Streamlit's server for app.py: pages/ only through app.py's st.navigation, optional basic auth.

Streamlit treats a `pages/` folder beside the entry script as a v1 multipage app until some
session has run `st.navigation`; until then a first request for a deep link (/launch, a
bookmarked /compare?runs=...) would run that page file alone, without app.py's layout and
navigation. Clearing the flag before the server starts makes every request go through app.py.

Streamlit's browser code finds its server by trying the page's own path first: on a deep link
(/compare) it asks /compare/_stcore/health and /compare/_stcore/host-config, gets 404s, and only
then tries /. Answering those would be worse: the browser would take /compare as the app's base
and open the default page. So `RootBase` tells the browser where the server is instead: every
HTML page it serves sets `window.__streamlit.BACKEND_BASE_URL` (Streamlit's embedding setting) to
the server's root, and the browser asks there first and only.

While the server starts, a thread reads what the first visitor would wait for (`ui.warm`: the
store's fingerprints and the default Compare selection's histories, into the pages' own caches),
then does the rest of the pages' first runs' work: their imports, Streamlit's REPL check
(`first_run_work`).

`draftboard ui --auth` sets AUTH_VAR: then every HTTP request and websocket handshake needs
HTTP basic auth with USER_VAR / PASSWORD_VAR, except Streamlit's health probe (a container's
health check; it says only "ok"). The check is an ASGI middleware put in front of Streamlit's
own (its Starlette server, as `st.App(middleware=...)` does), so no page script runs for a
visitor without credentials. Basic auth sends the password with every request: serve it over
TLS (a reverse proxy) or on a trusted network (docs/SECURITY.md).
"""

from __future__ import annotations

import base64
import binascii
import gc
import hmac
import importlib
import ipaddress
import json
import logging
import os
import pkgutil
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from tracker import config, lifecycle
from tracker.errors import DraftboardError

AUTH_VAR, USER_VAR, PASSWORD_VAR = config.UI_AUTH_VAR, config.UI_USER_VAR, config.UI_PASSWORD_VAR
DEFAULT_USER = "draftboard"
MIN_PASSWORD_CHARS = 12
OPEN_PATHS = frozenset({"/_stcore/health"})
REALM = "draftboard"
# How `draftboard ui` runs Streamlit, besides its address. No file watcher: the app's files do not change
# under a deployment, and the default one walks the app's folder on every new session. No collection of the
# whole heap after each script run (Streamlit's default): at 10,000 runs the store's index is most of the
# heap, and scanning it cost each page visit about 0.2 s; Python's own collector still runs as usual.
STREAMLIT_OPTIONS = ("--server.headless", "true", "--browser.gatherUsageStats", "false", "--server.fileWatcherType",
                     "none", "--client.toolbarMode", "minimal", "--runner.postScriptGC", "false")


@dataclass(frozen=True)
class Credentials:
    user: str
    password: str


def credentials_from_env(env: Mapping[str, str] | None = None) -> Credentials:
    """The dashboard's basic-auth login; DraftboardError naming the variable when it is unusable."""
    env = os.environ if env is None else env
    password = env.get(PASSWORD_VAR, "")
    if len(password) < MIN_PASSWORD_CHARS:
        raise DraftboardError(f"--auth needs {PASSWORD_VAR} set to a password of at least {MIN_PASSWORD_CHARS} "
                              f"characters (and optionally {USER_VAR}, default {DEFAULT_USER!r})")
    user = env.get(USER_VAR) or DEFAULT_USER
    if ":" in user:
        raise DraftboardError(f"{USER_VAR} must not contain ':' (basic auth splits user and password there)")
    return Credentials(user, password)


_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def _host_name(value: str) -> str:
    """`name` of a Host header or an Origin's authority: `Name:8501` -> `name`, `[::1]:8501` -> `::1`."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def is_loopback_name(name: str) -> bool:
    if name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class HostCheck:
    """ASGI middleware: answer only requests addressed to this dashboard by name (DNS rebinding).

    A web page the user has open can make `evil.example` resolve to 127.0.0.1 and then talk to a
    loopback dashboard as its own origin; the browser still sends `Host: evil.example` (and, on a
    websocket, `Origin: http://evil.example`). So every HTTP request and websocket handshake needs
    a loopback Host or one of `allowed` (DRAFTBOARD_UI_HOSTS, for a public bind or a proxy's
    name), and an Origin, where one is sent, naming such a host too. Anything else gets 403;
    Streamlit's health probe stays open (a container's check uses whatever name it has).
    """

    def __init__(self, app, allowed: tuple[str, ...] = ()) -> None:
        self.app = app
        self.allowed = frozenset(_host_name(h) for h in allowed)

    def _ok(self, name: str) -> bool:
        return is_loopback_name(name) or name in self.allowed

    def accepts(self, headers) -> bool:
        host = origin = None
        for key, value in headers:
            if key.lower() == b"host":
                host = value.decode("latin-1")
            elif key.lower() == b"origin":
                origin = value.decode("latin-1")
        if host is None or not self._ok(_host_name(host)):
            return False
        if origin is None:
            return True
        authority = urlsplit(origin).netloc
        return bool(authority) and self._ok(_host_name(authority))

    async def __call__(self, scope, receive, send) -> None:
        await _gate(self.app, scope, receive, send, self.accepts, 403, [], (
            f"403: this dashboard answers only to loopback names and {config.UI_HOSTS_VAR}\n").encode())


class BasicAuth:
    """ASGI middleware: 401 (HTTP) or a refused handshake (websocket) without the right login."""

    def __init__(self, app, user: str, password: str) -> None:
        self.app = app
        self._expected = f"{user}:{password}".encode()

    def authorized(self, headers) -> bool:
        for name, value in headers:
            if name.lower() == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() != b"basic":
                    return False
                try:
                    given = base64.b64decode(token.strip(), validate=True)
                except (binascii.Error, ValueError):
                    return False
                return hmac.compare_digest(given, self._expected)
        return False

    async def __call__(self, scope, receive, send) -> None:
        challenge = (b"www-authenticate", f'Basic realm="{REALM}", charset="UTF-8"'.encode())
        await _gate(self.app, scope, receive, send, self.authorized, 401, [challenge], b"authentication required\n")


async def _gate(app, scope, receive, send, allows, status: int, headers: list, body: bytes) -> None:
    """Pass HTTP and websocket requests that `allows(headers)` (and the open paths) to app; refuse
    the rest: `status` with body over HTTP, a closed handshake (the server answers 403) on a websocket."""
    kind = scope["type"]
    if kind not in ("http", "websocket") or scope["path"] in OPEN_PATHS or allows(scope["headers"]):
        await app(scope, receive, send)
    elif kind == "websocket":
        await send({"type": "websocket.close", "code": 1008})
    else:
        await send({"type": "http.response.start", "status": status,
                    "headers": [*headers, (b"content-type", b"text/plain; charset=utf-8")]})
        await send({"type": "http.response.body", "body": body})


def with_root_base(html: bytes, base_path: str) -> bytes:
    """The page with a script, first in <head>, that points Streamlit's browser code at the server's
    root (`base_path`: server.baseUrlPath, "" by default) instead of the deep link's path."""
    root = "/" + base_path.strip("/") + "/" if base_path.strip("/") else "/"
    script = ("<script>window.__streamlit=Object.assign({},window.__streamlit,"
              f"{{BACKEND_BASE_URL:window.location.origin+{json.dumps(root)}}});</script>").encode()
    head = html.find(b"<head>")
    return html if head < 0 else html[:head + 6] + script + html[head + 6:]


class RootBase:
    """ASGI middleware: HTML responses get `with_root_base`; everything else passes untouched."""

    def __init__(self, app, base_path: str = "") -> None:
        self.app = app
        self.base_path = base_path

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        start: dict | None = None
        body = bytearray()

        async def send_html(message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers", []))
                if not headers.get(b"content-type", b"").startswith(b"text/html") or b"content-encoding" in headers:
                    start = None
                    await send(message)
                    return
                start = message
                return
            if start is None:
                await send(message)
                return
            body.extend(message.get("body", b""))
            if message.get("more_body"):
                return
            page = with_root_base(bytes(body), self.base_path)
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(page)).encode())]})
            await send({"type": "http.response.body", "body": page})

        await self.app(scope, receive, send_html)


def _add_middleware(credentials: Credentials | None) -> None:
    """Put HostCheck, RootBase (and, with credentials, BasicAuth) around Streamlit's own middleware.

    HostCheck goes first (outermost), then BasicAuth: nothing runs for a request under another
    name or without the login. RootBase goes last (innermost, inside Streamlit's gzip), so it sees
    the page uncompressed."""
    from starlette.middleware import Middleware
    from streamlit import config as st_config
    from streamlit.web.server.starlette import starlette_app

    streamlit_middleware = starlette_app.create_streamlit_middleware

    def ours() -> list:
        auth = [] if credentials is None else [
            Middleware(BasicAuth, user=credentials.user, password=credentials.password)]
        base = st_config.get_option("server.baseUrlPath") or ""
        hosts = Middleware(HostCheck, allowed=config.ui_hosts())
        return [hosts, *auth, *streamlit_middleware(), Middleware(RootBase, base_path=base)]

    starlette_app.create_streamlit_middleware = ours


def main(argv: list[str]) -> None:
    lifecycle.watch_parent_from_env()
    from streamlit.runtime.pages_manager import PagesManager
    from streamlit.web import cli

    _add_middleware(credentials_from_env() if os.environ.get(AUTH_VAR) == "basic" else None)
    PagesManager.uses_pages_directory = False
    logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").addFilter(_warm_needs_no_session)
    threading.Thread(target=_warm, name=WARM_THREAD, daemon=True).start()
    cli.main(args=["run", *argv], prog_name="streamlit")


WARM_THREAD = "draftboard-warm"


def _warm_needs_no_session(record: logging.LogRecord) -> bool:
    """The warm-up fills the pages' Streamlit caches outside any visitor's session, as it must; Streamlit warns of
    that ("missing ScriptRunContext") in the terminal on every start: not said for that thread."""
    return threading.current_thread().name != WARM_THREAD


def _warm() -> None:
    """The first visitor's reads, done while the server starts (`ui.warm`: the same caches the pages use); then
    everything alive, the store's index and the modules most of all, moved out of the cycle collector's sight
    (`gc.freeze`): at 10,000 runs each automatic full collection scanned them again, 0.4 s that a visitor waited
    for every few page visits. What is frozen is still freed once dropped: the index holds no cycle, so one a
    later read replaces goes as soon as no page uses it."""
    from tracker.dashboard import ui

    print(ui.warm(config.store_uri()), file=sys.stderr, flush=True)
    first_run_work()
    gc.freeze()


def first_run_work() -> None:
    """What the pages' first script runs in this process would do besides reading the store, done before
    a visitor waits for it (0.15 s of the first visit's server time here, 2 cores). First the imports the
    pages make on first use: the dashboard's modules; pandas' Styler with its jinja2, which Environments and
    Compare colour their tables with (imported here, not by the modules that return one: the CLI's `report`
    imports those too and styles nothing); Streamlit's emoji and icon-name tables, which app.py's favicon
    and page icons are checked against. Then Streamlit's REPL check, which it makes on the first element
    drawn (`env_util.is_repl`: `inspect.stack()`, which maps every loaded module, mlflow's and pandas'
    included, to its file); `inspect` keeps that map, so once it is made here, after every import above,
    the first visitor's own check takes milliseconds."""
    import pandas.io.formats.style  # noqa: F401
    import streamlit.emojis  # noqa: F401
    import streamlit.material_icon_names  # noqa: F401
    from streamlit import env_util

    import tracker.dashboard

    for module in pkgutil.iter_modules(tracker.dashboard.__path__, "tracker.dashboard."):
        importlib.import_module(module.name)
    env_util.is_repl()


if __name__ == "__main__":
    main(sys.argv[1:])
