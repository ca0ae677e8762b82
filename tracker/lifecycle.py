"""Process lifecycle: children that die with their parent, an ordered stop, and who holds a port.

`draftboard ui` starts a worker and a Streamlit server; a worker starts eval subprocesses. None of
them may outlive the process that started it:
- on Linux the kernel signals a child when its parent dies (`die_with_parent_hook`, PR_SET_PDEATHSIG,
  given to Popen as preexec_fn), even when the parent was SIGKILLed or OOM-killed;
- as the portable fallback (and a second line on Linux), a child started with `parent_env()` in its
  environment watches its parent from a thread (`watch_parent_from_env`, called by the entry points
  `tracker.cli.main` and `tracker.serve.main`) and stops itself once it has been reparented;
- a parent that is asked to stop (SIGTERM, SIGINT, SIGHUP) stops its children one after the other
  with a bounded grace period each (`Supervisor`).
`port_in_use` tells a second `draftboard ui` why its port is taken, naming an earlier draftboard.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tracker.errors import DraftboardError

# The pid a child must stay a child of. Not DRAFTBOARD_-prefixed, so that nothing forwarding the
# DRAFTBOARD_* variables (the Ray launcher) hands it on, and consumed by the child on start.
PARENT_PID_VAR = "_DRAFTBOARD_PARENT_PID"
# How often the fallback watchdog looks at its parent, and how long a child that found itself
# orphaned may spend in its own SIGTERM handling before it is killed: together well inside 5 s.
LIVENESS_POLL_S = 0.5
ORPHAN_GRACE_S = 3.0
# How long `draftboard ui` waits for each child after SIGTERM before SIGKILL. The worker gives its
# running eval 10 s (`run_worker(grace_s=10)`) and then records it, so it gets more.
STOP_GRACE_S = 20.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


# --------------------------------------------------------------------------- dying with the parent


@functools.cache
def _prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent_hook(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A Popen preexec_fn that has the kernel send `sig` to the child when its parent dies (Linux).

    None elsewhere (then only `parent_env`'s watchdog applies). The kernel's "parent" is the thread
    that forked, so start children from a thread that lives as long as they should. The hook only
    calls what was resolved before the fork: a preexec_fn must not import or take locks.
    """
    prctl = _prctl()
    if prctl is None:
        return None
    parent, sig, sigkill = os.getpid(), int(sig), int(signal.SIGKILL)

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # the parent died between the fork and the prctl
            os.kill(os.getpid(), sigkill)

    return hook


def parent_env(pid: int | None = None) -> dict[str, str]:
    """Environment entries that make a draftboard child (cli or serve) watch this process."""
    return {PARENT_PID_VAR: str(os.getpid() if pid is None else pid)}


def watch_parent_from_env(environ=None) -> threading.Thread | None:
    """Start the orphan watchdog when this process was started with `parent_env()`.

    The variable is removed from the environment so that this process's own children do not
    inherit a pid that is not their parent's.
    """
    environ = os.environ if environ is None else environ
    text = environ.pop(PARENT_PID_VAR, None)
    if not text:
        return None
    try:
        parent = int(text)
    except ValueError:
        return None
    thread = threading.Thread(target=_stop_when_orphaned, args=(parent,), name="parent-watchdog", daemon=True)
    thread.start()
    return thread


def _stop_when_orphaned(parent: int, poll_s: float = LIVENESS_POLL_S, grace_s: float = ORPHAN_GRACE_S) -> None:
    # A child whose parent died is reparented (to init or a subreaper), so getppid() changes.
    while os.getppid() == parent:
        time.sleep(poll_s)
    os.kill(os.getpid(), signal.SIGTERM)  # the process's own stop: a worker hands back its job
    time.sleep(grace_s)
    os.kill(os.getpid(), signal.SIGKILL)


def raise_exit(signum, _frame) -> None:
    """A signal handler: the signal becomes SystemExit, so `finally` blocks and context managers run."""
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def sigterm_exits():
    """While inside: SIGTERM (a worker's cancel) raises SystemExit in the main thread, so what the code
    started or wrote is stopped and removed on the way out; the previous handler after."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers live there
        yield
        return
    previous = signal.signal(signal.SIGTERM, raise_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def child_popen_kwargs(pdeathsig: int = signal.SIGTERM) -> dict:
    """Popen keyword arguments for a child that dies with this process and stops only when told.

    Its own session keeps a terminal's Ctrl-C (sent to the whole foreground group) away from it, so
    that the parent decides the order of the stop; SIGTERM on the parent's death lets the child run
    its own stop (`ORPHAN_GRACE_S` later the watchdog kills it).
    """
    return dict(start_new_session=True, preexec_fn=die_with_parent_hook(pdeathsig))


# --------------------------------------------------------------------------- ordered stop


@dataclass
class Child:
    name: str  # as printed: "stopping <name>…"
    proc: subprocess.Popen


class Supervisor:
    """Waits on a main child; on a stop signal or its exit, stops every child in order.

    children: in stopping order (the worker before the server it reports to). The main child is
    the one whose exit ends the supervision (the server).
    """

    def __init__(self, children: Sequence[Child], main: Child, grace_s: float = STOP_GRACE_S,
                 say: Callable[[str], None] = print) -> None:
        self.children, self.main, self.grace_s, self.say = list(children), main, grace_s, say
        self.signal: int | None = None
        self._stop = threading.Event()

    def _on_signal(self, signum, _frame) -> None:
        self.signal = signum
        self._stop.set()

    def run(self) -> int:
        """Block until a stop signal or the main child's exit; stop all; the main child's exit code."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        try:
            while not self._stop.wait(0.2) and self.main.proc.poll() is None:
                for child in self.children:  # reaped as it ends (the demo build finishes long before the ui)
                    child.proc.poll()
            self.stop_all()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        return 0 if self.signal is not None else (self.main.proc.returncode or 0)

    def stop_all(self) -> None:
        for child in self.children:
            if child.proc.poll() is None:  # one that already ended (a reused demo's check) is not said to stop
                self.say(f"stopping {child.name}…")
            _stop(child, self.grace_s, self.say)
        self.say("done")


def _stop(child: Child, grace_s: float, say: Callable[[str], None]) -> None:
    proc = child.proc
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        say(f"{child.name} still running {grace_s:g} s after SIGTERM: killing it")
        proc.kill()
        proc.wait()


# --------------------------------------------------------------------------- ports


def port_in_use(address: str, port: int) -> str | None:
    """None when (address, port) can be listened on; else one line saying who holds it.

    SO_REUSEADDR as the server sets it: a port left in TIME_WAIT by an earlier run is free.
    """
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        if os.name == "posix":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
            return None
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise DraftboardError(f"cannot listen on {address}:{port}: {exc.strerror}") from exc
    return f"port {port} is already in use{_describe_holder(port)}"


def _describe_holder(port: int) -> str:
    for pid in listening_pids(port):
        argv = _cmdline(pid)
        if _is_draftboard_server(argv):
            ui = _parent_pid(pid)
            if ui and _is_draftboard_ui(_cmdline(ui)):
                return f" by an earlier `draftboard ui` (pid {ui}); stop it with `kill {ui}`"
            return f" by the server of an earlier draftboard (pid {pid}); stop it with `kill {pid}`"
        if _is_draftboard_ui(argv):
            return f" by an earlier `draftboard ui` (pid {pid}); stop it with `kill {pid}`"
    return ": choose another --port"


def listening_pids(port: int) -> list[int]:
    """Pids with a TCP socket listening on port (Linux /proc; [] elsewhere or where unreadable)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                # local_address is HEXIP:HEXPORT; st 0A is LISTEN
                if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return []
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if any(_link(fd) in inodes for fd in (proc / "fd").iterdir()):
                pids.append(int(proc.name))
    return pids


def _link(fd: Path) -> str | None:
    """What an open descriptor points at; None for one closed since its folder was listed (a busy server opens and
    closes files all the time: one such fd must not hide the socket it holds beside it)."""
    try:
        return os.readlink(fd)
    except OSError:
        return None


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _parent_pid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _is_draftboard_server(argv: list[str]) -> bool:
    return "tracker.serve" in argv


def _is_draftboard_ui(argv: list[str]) -> bool:
    cli = "tracker.cli" in argv or any(Path(a).name == "draftboard" for a in argv[:2])
    return cli and "ui" in argv
