"""Warm processes for local jobs: a fork server that imported draftboard's eval code once, and the
eval processes it forks, each of which takes one job after another.

`LocalLauncher` runs a job whose argv is draftboard's own CLI through it. The first such job starts
the server (`warm.serve`, in a new interpreter), which imports torch, the harness and MLflow's
client once (`PRELOAD`) and forks *hosts*. A host runs `tracker.cli.main(args)` for one job, then
waits for the next: a sweep of checkpoints pays the interpreter and the imports once per worker,
and a device's CUDA context and the target's heads (held by `evaluators.target.held_heads`, keyed
by the target's content digest, device and dtype) once per host, not once per checkpoint.

Isolation: a host leads its own session, so a cancel signals exactly the job it runs (and ends the
host); a job that exits with anything but 0, or raises, retires its host, so what a failing job
may have left behind (a broken CUDA context, half-built state) never meets another job. Between
two jobs a host restores what a job may change in its process (environment, argv, working
directory, standard streams, signal handlers) and frees what the job held (drafter weights,
allocator caches). Hosts die with the server (PR_SET_PDEATHSIG), which dies with the worker's
thread that started it. The server itself never runs a job, reads no file a job names and never
touches a device (a CUDA context must not exist before a fork). A worker's concurrent jobs run in
different hosts; an idle host takes the next job, and only as many hosts exist as jobs ran at once.

Worker and server talk over a SOCK_SEQPACKET socket pair, one JSON message per packet: once its
imports are done the server says which devices its torch can use (`{"devices"}`, the worker's
registration, so the worker itself never imports torch); a request `{"job", "module", "args",
"env"}` carries the write end of the job's output pipe (SCM_RIGHTS), answered by
`{"started": job, "pid": host}`; `{"exited": job, "returncode": rc}` follows when the job ends
(a host that died mid-job reports as a process would: minus the signal). Server and host talk alike
over a pair of their own (`{"ended": rc}` after each job). When the worker closes its end, the server
kills its hosts and exits.
"""

from __future__ import annotations

import contextlib
import gc
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

from tracker.jobs.gpus import ENV as GPUS_ENV
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

    job: int  # the request's number: how the server knows it
    ended: threading.Event = field(default_factory=threading.Event)
    returncode: int | None = None


class WarmServer:
    """The worker's side of the fork server; thread-safe (one request at a time)."""

    def __init__(self, python: str = sys.executable) -> None:
        self._python = python
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None
        self._started: dict[str, object] = {}  # the server's answer to the job being started
        self._answer = threading.Condition()
        self._jobs = 0  # numbers the requests
        self._children: dict[int, WarmChild] = {}  # by request number, until the job ended
        self._devices: list[str] | None = None  # what the server's torch can run on, once it said so

    def start(self, module: str, args: list[str], env: dict[str, str]) -> tuple[int, IO[str], WarmChild]:
        """Run `module.main(args)` (as `python -m module args` would) with `env` in a warm host:
        (the host's pid, the job's output, its exit)."""
        with self._lock:
            sock = self._running()
            read, write = os.pipe()
            self._jobs += 1
            request = {"job": self._jobs, "module": module, "args": args, "env": env}
            try:
                with self._answer:
                    self._started.clear()
                    socket.send_fds(sock, [json.dumps(request).encode()], [write])
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

    def signal(self, child: WarmChild, sig: int) -> None:
        """Send `sig` to the job's host while it runs that job; never to a host that moved on to another
        (the server, which hands out hosts, decides, so a stop racing the job's end hits nothing)."""
        sock = self._sock
        if sock is not None and not child.ended.is_set():
            with contextlib.suppress(OSError):  # a server gone took its hosts with it
                sock.send(json.dumps({"signal": child.job, "number": int(sig)}).encode())

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
                        pid = message.get("pid", message.get("error"))
                        if isinstance(pid, int):
                            job = message["started"]
                            self._children[job] = self._started["child"] = WarmChild(job)
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


@dataclass
class _Host:
    """A forked eval process as the server sees it."""

    pid: int
    sock: socket.socket  # the server's end of their pair
    job: int | None = None  # the worker's request it runs now
    retiring: bool = False  # it exits (its last job failed or left a process, or it died): no more jobs
    # The GPUs its jobs see (CUDA_VISIBLE_DEVICES of its first job): CUDA reads that variable once per process, so
    # a host only takes jobs given the same GPUs (warm processes: one set per device set).
    gpus: str | None = None


def serve(fd: int) -> None:
    """The server's loop (single-threaded: it forks): hand each request to an idle host or a new one,
    report each job's end."""
    sock = socket.socket(fileno=fd)
    for name in PRELOAD:
        importlib.import_module(name)
    # What the imports made lives as long as the process: out of the collector's sight, a full
    # collection between two jobs takes microseconds instead of ~0.25 s, and a host's collections
    # leave these pages shared with the server.
    gc.freeze()
    try:
        sock.send(json.dumps({"devices": _devices()}).encode())
    except (BrokenPipeError, ConnectionResetError):
        return  # the worker stopped while this process imported (`worker --once` with nothing queued): nothing to serve
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so SIGCHLD reaches the wake-up fd
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    hosts: dict[int, _Host] = {}
    tie = die_with_parent_hook()  # made here: a host dies with this process, not with itself

    def fork_host(pending: list[int]) -> _Host:
        """A new host; `pending`: the request's descriptors, which reach it through its socket."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            for held in (selector, ours, sock, *(h.sock for h in hosts.values())):
                held.close()
            for fd in (wake_read, wake_write, *pending):  # a job's pipe held twice would never end
                os.close(fd)
            _host(theirs, tie)
        theirs.close()
        host = hosts[pid] = _Host(pid, ours)
        selector.register(ours, selectors.EVENT_READ, host)
        return host

    def take(packet: bytes, fds: list[int], gpus: str | None) -> _Host:
        for host in [h for h in hosts.values() if h.job is None and not h.retiring and h.gpus == gpus]:
            try:
                socket.send_fds(host.sock, [packet], fds)
                return host
            except OSError:
                host.retiring = True  # it died while idle: reaped when its SIGCHLD is read
        host = fork_host(fds)
        host.gpus = gpus
        socket.send_fds(host.sock, [packet], fds)
        return host

    def ended(host: _Host, returncode: int) -> None:
        if host.job is not None:
            sock.send(json.dumps({"exited": host.job, "returncode": returncode}).encode())
            host.job = None

    try:
        while True:
            for key, _ in selector.select():
                if key.fileobj is sock:
                    packet, fds, _flags, _addr = socket.recv_fds(sock, _PACKET, 1)
                    if not packet:
                        return  # the worker closed its end, or died
                    request = json.loads(packet)
                    if "signal" in request:
                        for host in hosts.values():
                            if host.job == request["signal"]:
                                with contextlib.suppress(OSError):
                                    os.killpg(host.pid, request["number"])
                        continue
                    job = request["job"]
                    try:
                        host = take(packet, fds, (request.get("env") or {}).get(GPUS_ENV))
                        host.job = job
                        sock.send(json.dumps({"started": job, "pid": host.pid}).encode())
                    except OSError as exc:
                        sock.send(json.dumps({"started": job, "error": str(exc)}).encode())
                    finally:
                        os.close(fds[0])
                elif key.fileobj is wake_read:
                    os.read(wake_read, 4096)
                    _reap(hosts, selector, ended)
                elif key.data.pid in hosts:  # (not reaped a moment ago)
                    host = key.data
                    try:
                        message = json.loads(host.sock.recv(_PACKET) or b'{"gone": true}')
                    except (OSError, ValueError):
                        message = {"gone": True}
                    if "ended" in message:
                        host.retiring = message["ended"] != 0 or message.get("retiring", False)
                        ended(host, message["ended"])
                    elif "gone" in message:  # its exit follows as SIGCHLD; until then, no more reads
                        host.retiring = True
                        with contextlib.suppress(KeyError, ValueError):
                            selector.unregister(host.sock)
    finally:
        for pid in hosts:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        os._exit(0)  # nothing to tear down: the imports go with the process


def _devices() -> list[str]:
    """The devices a job in a host forked from here can use: cpu, and cuda where this torch sees a GPU,
    asked through NVML, which (unlike the CUDA runtime) leaves nothing behind that a fork would break."""
    import torch

    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    try:
        return ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
    finally:
        del os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"]


def _reap(hosts: dict[int, _Host], selector: selectors.BaseSelector, ended) -> None:
    while hosts:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        host = hosts.pop(pid, None)
        if host is not None:
            ended(host, os.waitstatus_to_exitcode(status))  # a host that died mid-job: cancelled or crashed
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)  # what its jobs started and left in its session
            with contextlib.suppress(KeyError, ValueError):
                selector.unregister(host.sock)
            host.sock.close()


# --------------------------------------------------------------------------- a host


def _host(sock: socket.socket, tie) -> None:
    """Become a host: a session of its own, tied to the server's life (`tie`, where the platform has
    PR_SET_PDEATHSIG); run each job the server sends until one fails or the server goes; never returns."""
    code = 1
    try:
        os.setsid()
        if tie is not None:
            tie()
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        home = _State.now()
        while True:
            packet, fds, _flags, _addr = socket.recv_fds(sock, _PACKET, 1)
            if not packet:
                code = 0  # the server went (the worker stops)
                return
            code = _job(json.loads(packet), fds[0], devnull)
            home.restore()
            # A failed job retires its host, and so does one that left processes running (the
            # server kills the host's session once the host is gone, as a fresh process's would be).
            retiring = code != 0 or _children_left()
            sock.send(json.dumps({"ended": code, "retiring": retiring}).encode())
            if retiring:
                return
    except BaseException:  # noqa: BLE001 - a host that cannot go on ends; the server reports its exit
        code = code or 1
    finally:
        os._exit(code)


def _job(request: dict, output: int, devnull: int) -> int:
    """Run one job in this process as a fresh `python -m MODULE ARGS` would: its environment, argv and
    output; its exit status as the process's would be (1 for an exception, whose traceback goes to its log)."""
    code = 1
    try:
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [request["module"], *request["args"]]
        # The entry is named, as `python -m MODULE` names it: the module the launcher's entry runs,
        # whose `__main__` block is `sys.exit(main())`.
        raise SystemExit(importlib.import_module(request["module"]).main(request["args"]))
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code
        if not isinstance(code, int):
            print(code, file=sys.stderr)  # as the interpreter reports a non-integer exit
            code = 1
    except BaseException:  # noqa: BLE001 - the job's own traceback, in its log, as a fresh process prints it
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(devnull, 1)  # the job's output ends here: the worker reads its end of file
        os.dup2(devnull, 2)
    return code & 0xFF


def _children_left() -> bool:
    """Whether a process this one started is still running (the ones that ended are reaped here)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        return False
    return True


@dataclass
class _State:
    """What a job may change in its process that the next job must find as a fresh process would."""

    environ: dict[str, str]
    argv: list[str]
    cwd: str
    handlers: dict[int, object]

    @classmethod
    def now(cls) -> "_State":
        return cls(dict(os.environ), list(sys.argv), os.getcwd(), {sig: signal.getsignal(sig) for sig in _SIGNALS})

    def restore(self) -> None:
        os.environ.clear()
        os.environ.update(self.environ)
        sys.argv = list(self.argv)
        os.chdir(self.cwd)
        for sig, handler in self.handlers.items():
            signal.signal(sig, handler)
        # The job's objects (its drafter above all) go now, not when the next job allocates; what
        # outlives it (modules it imported, held heads) joins the imports, out of the collector's sight.
        gc.collect()
        gc.freeze()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.empty_cache()


_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
