"""A loopback HTTP server for the tests that stand in for another service (a "tracking server" that
records credentials, an engine shaped as SGLang answers): the handler says what it answers."""

from __future__ import annotations

import http.server
import threading


class LoopbackServer:
    """Serves `handler` (a BaseHTTPRequestHandler class) on a free 127.0.0.1 port until close()."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]):
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
