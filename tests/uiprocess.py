"""A real `draftboard ui` subprocess for the tests, and the process checks they share."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from waiting import wait_until

STARTUP_S = 240.0  # a Streamlit server or an eval importing torch on two busy cores


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as response:
            return response.read().strip() == b"ok"
    except OSError:
        return False


def gone(proc: psutil.Process) -> bool:
    """Exited (or only a zombie waiting for its reaper); a reused pid is a different Process."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class Ui:
    """A `draftboard ui` subprocess with its output in a file."""

    def __init__(self, home: Path, port: int, *flags: str, env: dict | None = None) -> None:
        self.port, self.log = port, home.parent / f"ui-{port}-{time.monotonic_ns()}.log"
        argv = [sys.executable, "-m", "tracker.cli", "ui", "--port", str(port), "--home", str(home), *flags]
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, **(env or {})})

    def output(self) -> str:
        return self.log.read_text()

    def wait_serving(self, children: int) -> list[psutil.Process]:
        """Wait until the dashboard answers and `children` children run; return every descendant."""
        def up():
            if self.proc.poll() is not None:
                pytest.fail(f"draftboard ui exited ({self.proc.returncode}):\n{self.output()[-3000:]}")
            kids = psutil.Process(self.proc.pid).children(recursive=True)
            return healthy(self.port) and len(kids) >= children and kids
        return wait_until(up, STARTUP_S, interval=0.1, what="dashboard serving")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
