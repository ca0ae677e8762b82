"""A warm process for local jobs: a fork server that imported draftboard's eval code once.

`LocalLauncher` runs a job whose argv is draftboard's own CLI through it. The first such job
starts the server (`warm.serve`, in a new interpreter), which imports torch, the harness
and MLflow's client once (`PRELOAD`) and then forks one child per job, so a sweep of checkpoints
pays the interpreter, the imports and the CLI's set-up once instead of once per checkpoint.

A child is the job, as a fresh `python -m tracker.cli` would be: it leads its own session (a
cancel signals its process group), dies with the server (PR_SET_PDEATHSIG), which dies with the
worker's thread that started it, gets the job's environment and argv, and writes its output to a
pipe the worker reads as it reads a subprocess's. What outlives a job is only what the server
imported: it never runs a job itself, reads no file a job names and never touches a device (a
CUDA context must not exist before a fork), so a job that failed, was cancelled or was killed
leaves the next one as a fresh process would find it. Drafter weights, the target's heads and the
eval's caches live in the child and end with it; what a warm eval reuses across checkpoints is
on disk (evaluators/cache.py), keyed by the target's content digest.

Worker and server talk over a SOCK_SEQPACKET socket pair, one JSON message per packet: once its
imports are done the server says which devices its torch can use (`{"devices"}`, the worker's
registration, so the worker itself never imports torch); a request
`{"module", "args", "env"}` carries the write end of the job's output pipe (SCM_RIGHTS), answered by
`{"started": pid}`; `{"exited": pid, "returncode": rc}` follows when the child ends. When the
worker closes its end, the server kills whatever children are left and exits.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import IO

from tracker.jobs.launchers.base import LaunchError
from tracker.lifecycle import die_with_parent_hook

# Imported by the server before its first fork: what every eval imports, MLflow's SQL store and its
# migration check included (measured: a forked eval's first second, 1.75 s -> 0.71 s), and nothing
# that starts a thread or touches a device.
PRELOAD = ("torch", "tracker.cli", "evaluators.harness", "evaluators.logging", "tracker.store.tracker",
           "mlflow.tracking.client", "mlflow.store.tracking.sqlalchemy_store", "alembic.command",
           "alembic.runtime.migration", "sqlalchemy.dialects.sqlite", "safetensors.torch", "pyarrow.pandas_compat")
# How long a fork request may wait for the server's answer (its first answer waits for PRELOAD).
START_TIMEOUT_S = 300.0
_PACKET = 1 << 20
# The server's entry (not `-m` of this module, which its package has imported already).
_SERVE = "import sys; from tracker.jobs.launchers.warm import serve; serve(int(sys.argv[1]))"


@dataclass
class WarmChild:
    """A started job as the worker sees it: set once the server reported its exit."""

    ended: threading.Event = field(default_factory=threading.Event)
    returncode: int | None = None


class WarmServer:
    """The worker's side of the fork server; thread-safe (one request at a time)."""

    def __init__(self, python: str = sys.executable) -> None:
        self._python = python
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None
        self._started: dict[str, object] = {}  # the server's last answer to a fork request
        self._answer = threading.Condition()
        self._children: dict[int, WarmChild] = {}
        self._devices: list[str] | None = None  # what the server's torch can run on, once it said so

    def start(self, module: str, args: list[str], env: dict[str, str]) -> tuple[int, IO[str], WarmChild]:
        """Fork a child that runs `module.main(args)` (as `python -m module args` would) with `env`:
        (pid, its output, its exit)."""
        with self._lock:
            sock = self._running()
            read, write = os.pipe()
            try:
                with self._answer:
                    self._started.clear()
                    socket.send_fds(sock, [json.dumps({"module": module, "args": args, "env": env}).encode()], [write])
                    self._answer.wait_for(lambda: "pid" in self._started, START_TIMEOUT_S)
                    pid, child = self._started.get("pid"), self._started.get("child")
            except OSError as exc:
                os.close(read)
                raise LaunchError(f"the warm eval process did not take the job: {exc}") from exc
            finally:
                os.close(write)
            if not isinstance(pid, int) or not isinstance(child, WarmChild):
                os.close(read)
                self._kill()  # a server that answers late must not start the job after it was failed
                raise LaunchError(f"the warm eval process did not start the job ({pid or 'no answer'})")
            return pid, os.fdopen(read, encoding="utf-8", errors="replace"), child

    def prepare(self) -> None:
        """Start the server now: it imports while the worker starts up and waits for a job."""
        with self._lock:
            self._running()

    def devices(self) -> list[str]:
        """The devices its jobs can use, as the server's torch sees them (waits for its imports)."""
        with self._lock:
            self._running()
        with self._answer:
            self._answer.wait_for(lambda: self._devices is not None or self._sock is None, START_TIMEOUT_S)
            if self._devices is None:
                raise LaunchError("the warm eval process stopped before it said which devices it can use")
            return list(self._devices)

    def close(self) -> None:
        """Stop the server (it kills any child left); the next `start` begins a new one."""
        with self._lock:
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)
            if self._proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=10)

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self._proc.pid, signal.SIGKILL)  # its children die with it (PR_SET_PDEATHSIG)
            self._proc.wait()

    def _running(self) -> socket.socket:
        if self._sock is not None and self._proc is not None and self._proc.poll() is None:
            return self._sock
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._devices = None
        started = threading.Event()
        failure: list[OSError] = []

        def keep() -> None:
            # The kernel's "parent" of a PR_SET_PDEATHSIG child is the thread that forked it: this
            # one lives exactly as long as the server, so the server dies with the worker.
            try:
                self._proc = subprocess.Popen(
                    [self._python, "-c", _SERVE, str(theirs.fileno())],
                    pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, start_new_session=True,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=die_with_parent_hook())
            except OSError as exc:
                failure.append(exc)
                return
            finally:
                theirs.close()
                started.set()
            self._proc.wait()

        threading.Thread(target=keep, name="warm-eval-process", daemon=True).start()
        started.wait()
        if failure:
            ours.close()
            raise LaunchError(f"cannot start the warm eval process: {failure[0]}")
        self._sock = ours
        threading.Thread(target=self._read, args=(ours,), name="warm-eval-answers", daemon=True).start()
        return ours

    def _read(self, sock: socket.socket) -> None:
        """Dispatch the server's answers until it goes away; then every job it ran has ended."""
        try:
            while packet := sock.recv(_PACKET):
                message = json.loads(packet)
                if "devices" in message:
                    with self._answer:
                        self._devices = [str(d) for d in message["devices"]]
                        self._answer.notify_all()
                elif "started" in message:
                    with self._answer:
                        pid = message["started"]
                        if isinstance(pid, int):
                            self._children[pid] = self._started["child"] = WarmChild()
                        self._started["pid"] = pid
                        self._answer.notify_all()
                elif message.get("exited") in self._children:
                    child = self._children.pop(message["exited"])
                    child.returncode = message["returncode"]
                    child.ended.set()
        except (OSError, ValueError):
            pass  # a server that died mid-answer: its jobs end below
        finally:
            sock.close()
            with self._answer:
                if self._sock is sock:
                    self._sock = None
                self._started.setdefault("pid", "the warm eval process stopped")
                self._answer.notify_all()
            for child in self._children.values():
                child.returncode = -signal.SIGKILL  # the server's death took them (PR_SET_PDEATHSIG)
                child.ended.set()
            self._children.clear()


# --------------------------------------------------------------------------- the server


def serve(fd: int) -> None:
    """The server's loop (single-threaded: it forks): fork a child per request, report its exit."""
    sock = socket.socket(fileno=fd)
    for name in PRELOAD:
        importlib.import_module(name)
    sock.send(json.dumps({"devices": _devices()}).encode())
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so SIGCHLD reaches the wake-up fd
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    children: set[int] = set()
    tie = die_with_parent_hook()  # made here: a child dies with this process, not with itself
    try:
        while True:
            for key, _ in selector.select():
                if key.fileobj is sock:
                    packet, fds, _flags, _addr = socket.recv_fds(sock, _PACKET, 1)
                    if not packet:
                        return  # the worker closed its end, or died
                    request = json.loads(packet)
                    pid = os.fork()
                    if pid == 0:
                        selector.close()
                        _child(request, fds[0], [sock.fileno(), wake_read, wake_write], tie)
                    os.close(fds[0])
                    children.add(pid)
                    sock.send(json.dumps({"started": pid}).encode())
                else:
                    os.read(wake_read, 4096)
                    _reap(children, sock)
    finally:
        for pid in children:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        os._exit(0)  # nothing to tear down: the imports go with the process


def _devices() -> list[str]:
    """The devices a job forked from here can use: cpu, and cuda where this torch sees a GPU, asked
    through NVML, which (unlike the CUDA runtime) leaves nothing behind that a fork would break."""
    import torch

    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    try:
        return ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
    finally:
        del os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"]


def _reap(children: set[int], sock: socket.socket) -> None:
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        children.discard(pid)
        sock.send(json.dumps({"exited": pid, "returncode": os.waitstatus_to_exitcode(status)}).encode())


def _child(request: dict, output: int, inherited: list[int], tie) -> None:
    """Become the job: a session of its own, tied to the server's life (`tie`, where the platform
    has PR_SET_PDEATHSIG), the job's output, environment and argv; never returns."""
    code = 1
    try:
        os.setsid()
        if tie is not None:
            tie()
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        for fd in inherited:
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [request["module"], *request["args"]]
        # The entry is named, as `python -m MODULE` names it: the module the launcher's entry runs.
        code = importlib.import_module(request["module"]).main(request["args"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - the job's own traceback, in its log, as a fresh process prints it
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code if isinstance(code, int) else 1)
