"""Run Streamlit's server for app.py: pages/ only through app.py's st.navigation, optional basic auth.

Streamlit treats a `pages/` folder beside the entry script as a v1 multipage app until some
session has run `st.navigation`; until then a first request for a deep link (/launch, a
bookmarked /compare?runs=...) would run that page file alone, without app.py's layout and
navigation. Clearing the flag before the server starts makes every request go through app.py.

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
import hmac
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from tracker import config, lifecycle
from tracker.errors import DraftboardError

AUTH_VAR, USER_VAR, PASSWORD_VAR = config.UI_AUTH_VAR, config.UI_USER_VAR, config.UI_PASSWORD_VAR
DEFAULT_USER = "draftboard"
MIN_PASSWORD_CHARS = 12
OPEN_PATHS = frozenset({"/_stcore/health"})
REALM = "draftboard"


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
        kind = scope["type"]
        if kind not in ("http", "websocket") or scope["path"] in OPEN_PATHS or self.authorized(scope["headers"]):
            await self.app(scope, receive, send)
        elif kind == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # before accept: the server answers 403
        else:
            await send({"type": "http.response.start", "status": 401, "headers": [
                (b"www-authenticate", f'Basic realm="{REALM}", charset="UTF-8"'.encode()),
                (b"content-type", b"text/plain; charset=utf-8")]})
            await send({"type": "http.response.body", "body": b"authentication required\n"})


def _require_auth(credentials: Credentials) -> None:
    from starlette.middleware import Middleware
    from streamlit.web.server.starlette import starlette_app

    streamlit_middleware = starlette_app.create_streamlit_middleware

    def with_auth() -> list:
        return [Middleware(BasicAuth, user=credentials.user, password=credentials.password), *streamlit_middleware()]

    starlette_app.create_streamlit_middleware = with_auth


def main(argv: list[str]) -> None:
    lifecycle.watch_parent_from_env()
    from streamlit.runtime.pages_manager import PagesManager
    from streamlit.web import cli

    if os.environ.get(AUTH_VAR) == "basic":
        _require_auth(credentials_from_env())
    PagesManager.uses_pages_directory = False
    cli.main(args=["run", *argv], prog_name="streamlit")


if __name__ == "__main__":
    main(sys.argv[1:])
