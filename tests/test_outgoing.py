"""tracker/untrusted/outgoing.py: every outgoing request refuses redirects. An allowed engine (or the alert
webhook) answering 3xx must not send the worker to another URL, and what that URL would answer must
not reach a job's error (issue 37, finding 1: urllib's default opener followed them)."""

from __future__ import annotations

import http.server
import threading

import pytest

from evaluators.engines.base import EngineError
from evaluators.engines.vllm import VLLMClient
from tracker.measurement import regression


def _serve(handler) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def redirecting(request):
    """(URL of a server answering every request with `code` to another one, the other's hits)."""
    hits: list[str] = []

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"internal admin page: db password hunter2")

        do_POST = do_GET

        def log_message(self, *args):
            pass

    other = _serve(Elsewhere)

    class Redirecting(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(request.param)
            self.send_header("Location", f"http://127.0.0.1:{other.server_port}/admin")
            self.end_headers()

        do_POST = do_GET

        def log_message(self, *args):
            pass

    allowed = _serve(Redirecting)
    yield f"http://127.0.0.1:{allowed.server_port}", hits
    for server in (allowed, other):
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("redirecting", [301, 302, 303, 307, 308], indirect=True)
def test_an_engine_that_redirects_is_refused_not_followed(redirecting):
    url, hits = redirecting
    with pytest.raises(EngineError, match="a redirect; draftboard follows no redirect") as exc:
        VLLMClient(url).get_json("/v1/models")
    assert hits == [] and "hunter2" not in str(exc.value)
    with pytest.raises(EngineError, match="follows no redirect"):
        VLLMClient(url).post_json("/v1/completions", {"prompt": [1]})
    assert hits == []


@pytest.mark.parametrize("redirecting", [302, 307], indirect=True)
def test_the_alert_webhook_is_not_followed_elsewhere(redirecting, capsys):
    url, hits = redirecting
    alert = regression.Alert("r1", "v2 @ 100", "previous checkpoint", "r0", "v2 @ 50", -0.4, -0.6, -0.2, 16)
    assert regression.post(url, [alert]) is False
    assert hits == [] and "follows no redirect" in capsys.readouterr().err
