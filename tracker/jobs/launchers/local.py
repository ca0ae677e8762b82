"""The local launcher: a job's argv runs as a subprocess of the worker, in its own session.

Never through a shell. Stopping it is SIGTERM to its process group, then SIGKILL after the
grace period; a job dies with its worker (PR_SET_PDEATHSIG on Linux). A job that runs
draftboard's own CLI runs in a warm eval process that imported the eval code once and takes one job
after another (`tracker.jobs.launchers.warm`; `DRAFTBOARD_WARM_EVALS=0` starts each as a fresh
interpreter).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
from abc import abstractmethod
from collections.abc import Mapping
from typing import IO

from tracker import config, events
from tracker.jobs.launchers.base import DRAIN_S, Execution, JobOutput, LaunchError, Launcher, describe_exit
from tracker.jobs.launchers.warm import WarmChild, WarmServer
from tracker.jobs.queue import FAILED, SUCCEEDED, Job
from tracker.lifecycle import die_with_parent_hook


class LocalLauncher(Launcher):
    """Runs the job's argv as a subprocess of the worker, in its own session, never via a shell.

    entry: the command that runs draftboard's CLI (default: this interpreter's `-m tracker.cli`,
    run in a warm eval process where the platform forks and `config.warm_evals()` allows).
    """

    name = "local"

    def __init__(self, entry=None) -> None:
        super().__init__(entry)
        warm = entry is None and hasattr(os, "fork") and hasattr(socket, "send_fds") and config.warm_evals()
        self._warm = WarmServer() if warm else None

    def describe(self) -> str:
        return "local (warm eval processes)" if self._warm is not None else self.name

    def devices(self) -> list[str]:
        """The local torch's: cpu, plus cuda when torch sees a GPU (asked by the warm process, which
        imported torch already)."""
        if self._warm is not None:
            return self._warm.devices()
        import torch  # the eval subprocesses run this same torch

        return ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]

    def prepare(self) -> None:
        if self._warm is not None:
            self._warm.prepare()

    def close(self) -> None:
        if self._warm is not None:
            self._warm.close()

    def launch(self, job: Job, argv: list[str], output: JobOutput, env: Mapping[str, str] | None = None) -> Execution:
        # The worker's own store, stated: a job names none (tracker/config.py); lines reach the log as printed.
        env = {**os.environ, config.STORE_VAR: config.store_uri(), "PYTHONUNBUFFERED": "1", events.ASKED: "1",
               **(env or {})}
        if self._warm is not None and argv[:len(self.entry)] == self.entry:
            pid, stream, child = self._warm.start(self.entry[2], argv[len(self.entry):], env)  # [python, -m, module]
            return _WarmExecution(self._warm, pid, stream, child, output, job.id)
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                encoding="utf-8",
                errors="replace",
                start_new_session=True,
                env=env,
                preexec_fn=die_with_parent_hook(),  # a killed worker leaves no orphan eval
            )
        except (OSError, ValueError) as exc:
            raise LaunchError(f"cannot start {argv[0]}: {exc}") from exc
        return _LocalExecution(proc, output, job.id)


class _OutputPump(threading.Thread):
    """Copies a local job's output, line by line, into its JobOutput."""

    def __init__(self, stream: IO[str], output: JobOutput, job_id: int) -> None:
        # Daemon: a pipe held open by a process that escaped the job's group must not keep
        # the worker alive at exit.
        super().__init__(name=f"job-{job_id}-output", daemon=True)
        self._stream, self._output = stream, output

    def run(self) -> None:
        try:
            with self._stream:
                for line in self._stream:
                    self._output.feed(line)
        finally:
            self._output.flush_progress()
            self._output.close()


class _SessionExecution(Execution):
    """A job that leads a session of its own on this machine, its output pumped into its log: stopped
    through its process group. Subclasses say how its end is waited for and what it returned."""

    def __init__(self, pid: int, stream: IO[str], output: JobOutput, job_id: int) -> None:
        self.pid = pid
        self._pump = _OutputPump(stream, output, job_id)
        self._pump.start()

    @abstractmethod
    def _returncode(self) -> int | None:
        """The exit status of the job once it ended (negative: the signal that ended it)."""

    def _signal(self, sig: int) -> None:
        _signal_group(self.pid, sig)

    def stop(self, grace_s: float) -> str:
        """SIGTERM the job's process group, SIGKILL it after grace_s."""
        self._signal(signal.SIGTERM)
        if self.wait(grace_s):
            return ""
        self._signal(signal.SIGKILL)
        self.wait(None)
        return f"killed with SIGKILL after {grace_s:g} s grace"

    def drain(self) -> None:
        self._pump.join(DRAIN_S)
        if self._pump.is_alive():
            self._signal(signal.SIGKILL)
            self._pump.join(DRAIN_S)

    def outcome(self) -> tuple[str, str | None]:
        returncode = self._returncode()
        return (SUCCEEDED, None) if returncode == 0 else (FAILED, describe_exit(returncode))


class _LocalExecution(_SessionExecution):
    """A subprocess of the worker."""

    def __init__(self, proc: subprocess.Popen, output: JobOutput, job_id: int) -> None:
        self._proc = proc
        super().__init__(proc.pid, proc.stdout, output, job_id)

    def wait(self, timeout: float | None) -> bool:
        try:
            self._proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def _returncode(self) -> int | None:
        return self._proc.returncode


class _WarmExecution(_SessionExecution):
    """A job run by a warm eval process (pid: the process's), which goes on to the next job: its exit
    reported, and its signals sent, by the warm server, only while that process still runs it."""

    def __init__(self, server: WarmServer, pid: int, stream: IO[str], child: WarmChild, output: JobOutput,
                 job_id: int) -> None:
        self._server, self._child = server, child
        super().__init__(pid, stream, output, job_id)

    def _signal(self, sig: int) -> None:
        self._server.signal(self._child, sig)

    def wait(self, timeout: float | None) -> bool:
        return self._child.ended.wait(timeout)

    def _returncode(self) -> int | None:
        return self._child.returncode


def _signal_group(pid: int, sig: int) -> None:
    # The job leads its own session, so its process group id is its pid.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
