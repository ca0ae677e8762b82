"""A managed engine server: started on a loopback port from the engine's own Python, healthy or an
error, and stopped on every exit path.

Exit paths and what stops the server:
- the eval ends, fails or is interrupted: `ManagedServer.__exit__` (SIGTERM to the engine's process
  group, SIGKILL after `STOP_GRACE_S`);
- SIGTERM to the eval (the worker's cancel): turned into `SystemExit` while the server runs, so
  `__exit__` runs too;
- SIGKILL of the eval: the engine is started by a launcher (this module run as a script), a child of
  the eval that the kernel signals when the eval dies (`tracker.lifecycle`); it kills the engine's
  whole process group at once. vLLM and SGLang start engine-core and worker processes of their own,
  so killing only the server's pid would orphan them. The launcher exists before the engine does and
  exits when it ends, with its exit code, so no moment leaves an engine without a keeper.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from evaluators.engines.base import EngineError
from tracker import config, lifecycle, redact
from tracker.untrusted import outgoing

STOP_GRACE_S = 15.0
PROBE_TIMEOUT_S = 120.0
HEALTH_POLL_S = 1.0
LOG_TAIL_LINES = 15
# The line an engine dies on (an assertion, an abort, a Python traceback), looked for before the debugger's
# backtrace or interpreter noise that can follow it in the log's last lines.
_LAST_WORDS = re.compile(r"GGML_ASSERT|: failed to |Traceback|Error:|error:|Aborted|Segmentation fault")
_LAST_WORDS_WINDOW = 400  # lines from the end searched for them
KEEPER_POLL_S = 0.2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# What an engine, its probe or llama.cpp's converter may inherit of the eval's environment: an allow-list,
# so a credential under a name nobody foresaw (PGPASSWORD, a webhook URL, the queue's DSN) stays home.
# The process's own basics, the accelerator's and the math libraries' settings, the hub cache folders
# (offline: see OFFLINE), and each engine's own documented variables.
ENGINE_ENV_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "TZ", "LANG", "LANGUAGE", "TERM", "HOSTNAME",
    "LD_LIBRARY_PATH", "LD_PRELOAD", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH", "PYTHONHASHSEED",
    "PYTHONUNBUFFERED", "OMP_NUM_THREADS", "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "XDG_CACHE_HOME",
    "TRITON_CACHE_DIR"})
ENGINE_ENV_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "HIP_", "ROCR_", "NCCL_", "OPENBLAS_", "MKL_", "KMP_", "GOMP_",
                       "TORCHINDUCTOR_", "VLLM_", "SGLANG_", "LLAMA_", "GGML_")
# Variables with which an engine reports acceptance it did not measure: SGLang overwrites DFlash's accepted
# length with SGLANG_SIMULATE_ACC_LEN after the real compute (SGLang #32595). A managed eval with one set is refused.
SIMULATED_ACCEPTANCE = ("SGLANG_SIMULATE_ACC_LEN", "SGLANG_SIMULATE_ACC_TOKEN_MODE")
# A folder is served as staged (evaluators.engines.staging): nothing is fetched from a hub.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def engine_environment() -> dict[str, str]:
    """The environment an engine, a probe of it or llama.cpp's converter runs in: the allowed variables
    of this process's (ENGINE_ENV_NAMES, ENGINE_ENV_PREFIXES) that hold no secret by their value either
    (tracker.redact), and no hub access. Least privilege: it serves staged folders on loopback."""
    allowed = {k: v for k, v in os.environ.items() if k in ENGINE_ENV_NAMES or k.startswith(ENGINE_ENV_PREFIXES)}
    return {**redact.without_secrets(allowed), **OFFLINE}


def simulated_acceptance_problem(environ: Mapping[str, str]) -> str | None:
    """Why a managed engine started from `environ` would report acceptance it did not measure; None if not."""
    found = [name for name in SIMULATED_ACCEPTANCE if environ.get(name, "").strip()]
    if not found:
        return None
    return (f"{', '.join(found)} is set: SGLang then overwrites the drafter's acceptance with it after the real "
            "compute (SGLang #32595), so every served number would be simulated, not measured: unset it")


def start_probe(python: str, code: str) -> subprocess.Popen | None:
    """Run `code` in the engine's Python beside the server's start (they share nothing). It dies with
    the eval (SIGKILL on the parent's death), so a killed eval leaves no probe behind."""
    try:
        return subprocess.Popen([python, "-I", "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL, text=True, env=engine_environment(),
                                **lifecycle.child_popen_kwargs(signal.SIGKILL))
    except OSError:
        return None


def finish_probe(proc: subprocess.Popen | None) -> dict | None:
    """The probe's JSON object (its last stdout line), or None if it failed: the record says unknown."""
    if proc is None:
        return None
    try:
        out, _ = proc.communicate(timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None
    try:
        report = json.loads(out.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (ValueError, IndexError):
        return None
    return report if isinstance(report, dict) else None


def check_python(python: str | None, engine: str) -> str:
    """The engine's interpreter, checked before anything starts."""
    var = config.engine_python_var(engine)
    if not python:
        raise EngineError(f"a managed {engine} eval needs the engine's own Python: --engine-python PATH or {var} "
                          f"(a venv with {engine} installed; never draftboard's own){config.engine_setup(engine)}")
    path = Path(python).expanduser()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise EngineError(f"--engine-python {python}: no such executable")
    return str(path)


def log_tail(log: Path) -> str:
    """An engine log's last lines as one line, led by the line it died on where that lies further up."""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "(no log)"
    tail = " | ".join(line.strip() for line in lines[-LOG_TAIL_LINES:] if line.strip())[-2000:] or "(empty)"
    died = next((line.strip() for line in reversed(lines[-_LAST_WORDS_WINDOW:]) if _LAST_WORDS.search(line)), None)
    return f"{died[:300]} … {tail}" if died and died not in tail else tail


class ManagedServer:
    """Context manager: the server is healthy inside, stopped (with its whole process group) outside.

    argv_for(port) builds the command; log: where its output goes (read back into errors).
    """

    def __init__(self, engine: str, argv_for: Callable[[int], Sequence[str]], log: Path, *,
                 port: int | None = None, env: dict[str, str] | None = None, start_s: float = 600.0,
                 progress: Callable[[str, int, int], None] | None = None):
        self.engine, self.argv_for, self.log, self.start_s = engine, argv_for, log, start_s
        self.port, self.env, self.progress = port, env or {}, progress
        self.proc: subprocess.Popen | None = None  # the launcher: it lives exactly as long as the engine
        self.pgid: int | None = None  # the engine's process group
        self._previous_sigterm = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "ManagedServer":
        return self.launch().ready()

    def launch(self) -> "ManagedServer":
        """Start the server without waiting for it to be healthy (`ready` waits): a second server starts while
        the first is still loading. Stopped by `stop` (the context's exit)."""
        if self.port is not None:
            taken = lifecycle.port_in_use("127.0.0.1", self.port)
            if taken:
                raise EngineError(f"--engine-port {self.port}: {taken}")
        else:
            self.port = free_port()
        argv = list(self.argv_for(self.port))
        self.log.parent.mkdir(parents=True, exist_ok=True)
        if threading.current_thread() is threading.main_thread():  # signal handlers live there
            self._previous_sigterm = signal.signal(signal.SIGTERM, lifecycle.raise_exit)
        try:
            self.proc, self.pgid = _launch(argv, self.log, {**engine_environment(), **self.env})
        except BaseException:
            self.stop()
            raise
        return self

    def ready(self) -> "ManagedServer":
        """Wait until the launched server is healthy; stopped if it never is."""
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait_healthy(self) -> None:
        import urllib.error

        deadline, started = time.monotonic() + self.start_s, time.monotonic()
        while True:
            if self.proc.poll() is not None:
                raise EngineError(f"{self.engine} server exited with code {self.proc.returncode} before it was "
                                  f"healthy; its log ({self.log}) ends: {self.log_tail()}")
            try:
                with outgoing.open_url(self.url + "/health", 5) as response:  # loopback
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            waited = time.monotonic() - started
            if self.progress:
                self.progress(f"{self.engine}: starting", min(int(waited), int(self.start_s)), int(self.start_s))
            if time.monotonic() > deadline:
                raise EngineError(f"{self.engine} server was not healthy within {self.start_s:g} s "
                                  f"(DRAFTBOARD_ENGINE_START_S); its log ({self.log}) ends: {self.log_tail()}")
            time.sleep(HEALTH_POLL_S)

    def exited(self, within_s: float = 0.0) -> bool:
        """True if the server process has ended (waiting up to within_s for it to)."""
        try:
            self.proc.wait(timeout=within_s)
            return True
        except subprocess.TimeoutExpired:
            return False

    def log_tail(self) -> str:
        return log_tail(self.log)

    def stop(self) -> None:
        """Ask the launcher to stop the engine (SIGTERM to its group, SIGKILL after STOP_GRACE_S); if the
        launcher does not answer in time, kill both."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGUSR1)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=STOP_GRACE_S + 5)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.pgid is not None:
            _signal_group(self.pgid, signal.SIGKILL)  # whatever of the group outlived its keeper
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _launch(argv: list[str], log: Path, env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    """Start the launcher, which starts the engine (its output to `log`) and reports its pid on a pipe."""
    read, write = os.pipe()
    try:
        with open(log, "ab") as out:
            launcher = subprocess.Popen([sys.executable, "-m", "evaluators.engines.server", str(write), *argv],
                                        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                        pass_fds=(write,), **lifecycle.child_popen_kwargs(signal.SIGTERM))
    finally:
        os.close(write)
    with os.fdopen(read, "rb") as pipe:
        line = pipe.readline()  # the engine's pid, or EOF if the launcher could not start it
    if not line.strip().isdigit():
        launcher.wait()
        raise EngineError(f"the engine could not be started ({argv[0]}: exit code {launcher.returncode}); "
                          f"its log: {log}")
    return launcher, int(line)


def _keep(pid_fd: int, argv: list[str]) -> int:
    """The launcher: start the engine in a session (process group) of its own, then stop that group
    at once when the eval that started this dies (SIGTERM from the kernel, or a new parent), or
    gracefully when the eval asks (SIGUSR1). Exits with the engine's exit code when it ends."""
    parent, asked = os.getppid(), []
    signal.signal(signal.SIGTERM, lambda *_: asked.append("now"))
    signal.signal(signal.SIGUSR1, lambda *_: asked.append("graceful"))
    engine = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True,
                              preexec_fn=lifecycle.die_with_parent_hook(signal.SIGKILL))
    os.write(pid_fd, f"{engine.pid}\n".encode())
    os.close(pid_fd)
    while True:
        code = engine.poll()
        if code is not None:
            _signal_group(engine.pid, signal.SIGKILL)  # its children, if it left any
            return code if code >= 0 else 128 - code
        if "now" in asked or os.getppid() != parent:
            _signal_group(engine.pid, signal.SIGKILL)
            return 128 + signal.SIGTERM
        if "graceful" in asked:
            _signal_group(engine.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                engine.wait(timeout=STOP_GRACE_S)
            _signal_group(engine.pid, signal.SIGKILL)
            return 0
        time.sleep(KEEPER_POLL_S)


if __name__ == "__main__":
    sys.exit(_keep(int(sys.argv[1]), sys.argv[2:]))
