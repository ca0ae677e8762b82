"""scripts/sdist.py: the llama.cpp converter's sdist fetched as an archive, its digest pinned (issue 64, F11), from
an index that speaks pip's JSON simple API (PEP 691) on loopback."""

import hashlib
import http.server
import json
import subprocess
import sys
from pathlib import Path

from loopback import LoopbackServer

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "sdist.py"
ARCHIVE = b"\x1f\x8b not really a tarball, bytes to pin"


class _Index(LoopbackServer):
    def __init__(self):
        outer = self
        self.asked: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (the stdlib's name)
                outer.asked.append(self.path)
                if self.path == "/simple/llama-cpp-python/":
                    body = json.dumps({"files": [{"filename": "llama_cpp_python-0.3.36.tar.gz",
                                                  "url": f"{outer.url}/files/llama_cpp_python-0.3.36.tar.gz"}]})
                    self._send(body.encode(), "application/vnd.pypi.simple.v1+json")
                elif self.path == "/files/llama_cpp_python-0.3.36.tar.gz":
                    self._send(ARCHIVE, "application/octet-stream")
                else:
                    self.send_error(404)

            def _send(self, body: bytes, kind: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        super().__init__(Handler)


def _fetch(index: _Index, sha256: str, folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "llama-cpp-python", "0.3.36", sha256, str(folder)],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PIP_INDEX_URL": f"{index.url}/simple"})


def test_the_sdist_is_fetched_whole_and_kept_only_with_its_pinned_digest(tmp_path):
    index = _Index()
    try:
        good = _fetch(index, hashlib.sha256(ARCHIVE).hexdigest(), tmp_path)
        assert good.returncode == 0, good.stderr
        saved = Path(good.stdout.strip())
        assert saved == tmp_path / "llama_cpp_python-0.3.36.tar.gz" and saved.read_bytes() == ARCHIVE
        saved.unlink()
        bad = _fetch(index, "0" * 64, tmp_path)
        assert bad.returncode != 0 and "not the pinned" in bad.stderr and not saved.exists()
        assert index.asked == ["/simple/llama-cpp-python/", "/files/llama_cpp_python-0.3.36.tar.gz"] * 2
    finally:
        index.close()
