"""The dashboard's own access (issue 10 #11): who may reach `draftboard ui`, and what read-only opens.

- A non-loopback --address without --auth or --readonly is refused before anything starts.
- --auth is HTTP basic auth in front of Streamlit's server (tracker/serve.py): checked here against a
  real `draftboard ui` with real HTTP requests and websocket handshakes.
- --readonly starts no worker and creates nothing in the home folder.
"""

from __future__ import annotations

import base64
import signal
import socket
import urllib.error
import urllib.request

import pytest
from uiprocess import free_port, gone
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect
from waiting import wait_until

from tracker import serve
from tracker.cli import main

PASSWORD = "correct horse battery"


@pytest.fixture
def held_port():
    """A port something else listens on: `ui` reaching its port check has passed the address checks."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def run_ui(capsys, *argv) -> tuple[int, str]:
    code = main(["ui", *argv])
    captured = capsys.readouterr()
    return code, captured.err


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "192.168.1.20", "dashboard.example.com"])
def test_non_loopback_address_without_auth_or_readonly_is_refused(address, capsys, tmp_path, monkeypatch):
    monkeypatch.delenv(serve.PASSWORD_VAR, raising=False)
    code, err = run_ui(capsys, "--address", address, "--port", str(free_port()), "--home", str(tmp_path / "h"))
    assert code == 2
    assert err == (f"error: --address {address} lets other machines in: add --auth (a login) or --readonly "
                   "(no launch controls), or serve on 127.0.0.1\n")
    assert not (tmp_path / "h").exists()


@pytest.mark.parametrize("flags", [["--address", "127.0.0.1"], ["--address", "localhost"],
                                   ["--address", "0.0.0.0", "--readonly"], ["--address", "0.0.0.0", "--auth"]])
def test_loopback_or_readonly_or_auth_passes_the_address_check(flags, held_port, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv(serve.PASSWORD_VAR, PASSWORD)
    code, err = run_ui(capsys, *flags, "--port", str(held_port), "--home", str(tmp_path))
    assert code == 2 and err.startswith(f"error: port {held_port} is already in use"), err


@pytest.mark.parametrize("password", [None, "", "short"])
def test_auth_without_a_usable_password_is_one_line(password, capsys, tmp_path, monkeypatch):
    if password is None:
        monkeypatch.delenv(serve.PASSWORD_VAR, raising=False)
    else:
        monkeypatch.setenv(serve.PASSWORD_VAR, password)
    code, err = run_ui(capsys, "--auth", "--port", str(free_port()), "--home", str(tmp_path))
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: --auth needs {serve.PASSWORD_VAR} set to a password of at least "
                          f"{serve.MIN_PASSWORD_CHARS} characters")


def test_auth_user_with_a_colon_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv(serve.PASSWORD_VAR, PASSWORD)
    monkeypatch.setenv(serve.USER_VAR, "a:b")
    code, err = run_ui(capsys, "--auth", "--port", str(free_port()), "--home", str(tmp_path))
    assert code == 2 and f"{serve.USER_VAR} must not contain ':'" in err


# --------------------------------------------------------------------------- a real dashboard behind --auth


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def status(url: str, headers: dict | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture
def auth_ui(start_ui):
    ui, _ = start_ui("--auth", "--no-worker", children=1,
                     env={serve.PASSWORD_VAR: PASSWORD, serve.USER_VAR: "alice"})
    return ui


def test_auth_refuses_pages_and_websocket_without_the_login(auth_ui):
    base = f"http://127.0.0.1:{auth_ui.port}"
    assert status(base + "/") == 401
    assert status(base + "/launch") == 401
    assert status(base + "/", basic("alice", "wrong password!")) == 401
    assert status(base + "/", basic("mallory", PASSWORD)) == 401
    assert status(base + "/", {"Authorization": "Basic !!not-base64!!"}) == 401
    assert status(base + "/", {"Authorization": "Bearer " + PASSWORD}) == 401
    with urllib.request.urlopen(base + "/_stcore/health", timeout=10) as response:
        assert response.read().strip() == b"ok"  # the container health check needs no login
    with pytest.raises(InvalidStatus) as refused:
        connect(f"ws://127.0.0.1:{auth_ui.port}/_stcore/stream", open_timeout=10).close()
    assert refused.value.response.status_code == 403


def test_auth_lets_the_login_through(auth_ui):
    base = f"http://127.0.0.1:{auth_ui.port}"
    assert status(base + "/", basic("alice", PASSWORD)) == 200
    with connect(f"ws://127.0.0.1:{auth_ui.port}/_stcore/stream", additional_headers=basic("alice", PASSWORD),
                 open_timeout=10) as ws:
        assert ws.response.status_code == 101
    auth_ui.proc.send_signal(signal.SIGTERM)
    assert auth_ui.proc.wait(timeout=30) == 0


# --------------------------------------------------------------------------- read-only


def test_readonly_ui_starts_no_worker_and_writes_nothing_in_home(start_ui, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    ui, descendants = start_ui("--readonly", children=1)
    assert [" ".join(p.cmdline()).count("tracker.serve") for p in descendants] == [1]  # the server only
    assert list(home.iterdir()) == []  # no store, no jobs.db, no logs
    ui.proc.send_signal(signal.SIGTERM)
    assert ui.proc.wait(timeout=30) == 0
    wait_until(lambda: all(gone(p) for p in descendants), 30, what="server gone")
    assert list(home.iterdir()) == []

