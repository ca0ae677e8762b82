"""The demo build's progress file: written by `draftboard demo`, read by the dashboard on every rerun.

`./scripts/run.sh` serves the dashboard at once and builds the demo in a background process
(`draftboard ui --demo`); the page shows this file as a banner with a progress bar while the
runs land in the store. It lives in the home folder, outside the demo's own folder, so that the
demo's manifest (demo/build.py) never lists it. Stdlib only: the dashboard and `draftboard ui`
read it without importing the demo, torch or MLflow.

`store_ready` is false until the build has created the store's tables: MLflow creates them on
first open, and two processes doing that at once on a fresh SQLite file can fail, so the dashboard
does not open the store before then.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

PROGRESS_FILE = "demo-progress.json"
SCHEMA = "draftboard.demo-progress/1"
STARTING, RUNNING, DONE, FAILED = "starting", "running", "done", "failed"
STOPPED = "stopped"  # read only: RUNNING or STARTING, but the building process is gone
MIN_FRACTION_FOR_ETA = 0.01  # below this, the pace is mostly the interpreter and imports starting
MIN_STEP = 0.002  # within a stage, the file is rewritten once the bar moved this much (at most 500 writes)


@dataclass(frozen=True)
class DemoProgress:
    state: str
    pid: int  # the building process
    store: str  # the store URI the demo writes its runs to
    store_ready: bool
    stage: int = 0  # 1-based; 0 before the first stage
    stages: int = 0
    text: str = ""  # what the current stage does
    fraction: float = 0.0  # of the whole build's work, 0..1
    runs: int = 0  # runs written to the store so far
    started: float = 0.0  # unix seconds
    working_since: float = 0.0  # when its first stage began (the interpreter and imports were before); 0: not yet
    updated: float = 0.0
    error: str | None = None
    log: str | None = None  # where the building process's output goes, when somebody redirected it

    @property
    def building(self) -> bool:
        return self.state in (STARTING, RUNNING)

    def eta_s(self, now: float) -> float | None:
        """Seconds left at the pace so far (the fraction counts work, not stages), timed from the first stage: the
        start-up before it is no part of the work left (issue 65 LOW: a first reading of "about 44 min left" for a
        4-minute build); None before there is a pace to go by."""
        since = self.working_since or self.started
        if not self.building or self.fraction < MIN_FRACTION_FOR_ETA or now <= since:
            return None
        return (now - since) * (1 - self.fraction) / self.fraction


def progress_path(home: str | Path) -> Path:
    return Path(home) / PROGRESS_FILE


def write_progress(home: str | Path, progress: DemoProgress) -> DemoProgress:
    """Write atomically (a reader never sees half a file); returns what was written."""
    progress = replace(progress, updated=time.time())
    path = progress_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"schema": SCHEMA, **asdict(progress)}, indent=1) + "\n")
    os.replace(tmp, path)
    return progress


def read_progress(home: str | Path) -> DemoProgress | None:
    """The last progress written in `home`; None when there is none or it is unreadable.

    A build whose process has died without saying so (killed) reads as STOPPED.
    """
    try:
        data = json.loads(progress_path(home).read_text())
        if not isinstance(data, dict) or data.pop("schema", None) != SCHEMA:
            return None
        progress = DemoProgress(**data)
    except (OSError, ValueError, TypeError):
        return None
    if progress.building and not pid_alive(progress.pid):
        return replace(progress, state=STOPPED)
    return progress


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # somebody else's process: it exists
        return True
    except (OSError, OverflowError, ValueError):
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc (macOS): kill(0) is all we know


class ProgressWriter:
    """The build's side: keeps the record and rewrites the file on every change.

    `plan(work)` says how much work each stage is, in any one unit (the demo's: seconds on an idle
    machine), so the fraction moves as the work is done: a stage that takes most of the build
    takes most of the bar."""

    def __init__(self, home: str | Path, store: str, pid: int | None = None, log: str | None = None):
        self.home = Path(home)
        pid = os.getpid() if pid is None else pid
        announced = read_progress(home)  # by `draftboard ui --demo`, which started this process
        now = time.time()
        started = now
        if announced is not None and announced.pid == pid and announced.building:
            log, started = log or announced.log, announced.started
        self.current = DemoProgress(state=STARTING, pid=pid, store=store, store_ready=False, started=started,
                                    updated=now, log=log)
        self.work: list[float] = []

    def update(self, **fields) -> None:
        self.current = write_progress(self.home, replace(self.current, **fields))

    def plan(self, work: list[float]) -> None:
        if not work or any(not w > 0 for w in work):
            raise ValueError(f"each stage needs some work, got {work}")
        self.work = list(work)

    def _fraction(self, stage: int, done: float) -> float:
        return (sum(self.work[:stage - 1]) + min(max(done, 0.0), 1.0) * self.work[stage - 1]) / sum(self.work)

    def stage(self, n: int, text: str) -> None:
        self.update(state=RUNNING, stage=n, stages=len(self.work), text=text, fraction=self._fraction(n, 0.0),
                    working_since=self.current.working_since or time.time())

    def within_stage(self, done: float) -> None:
        """`done` (0..1) of the current stage is finished."""
        p = self.current
        fraction = self._fraction(p.stage, done) if p.stage else p.fraction
        if fraction - p.fraction >= MIN_STEP or (done >= 1 and fraction > p.fraction):
            self.update(fraction=fraction)

    def done(self, runs: int) -> None:
        self.update(state=DONE, store_ready=True, fraction=1.0, runs=runs, text="built")

    def failed(self, error: str) -> None:
        self.update(state=FAILED, error=error)
