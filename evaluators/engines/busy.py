"""How busy the box was during one timed window of a load sweep, beside the engine's own work.

The 1-minute load average counts every runnable thread, the engine's own included: a vLLM server on a
2-core box runs its OpenMP threads on both cores and its API server beside them, so the load average
reads above the cores through every healthy round and cannot tell a round another program slowed. What
did slow a round is CPU time other programs took while it ran: the box's busy time (`/proc/stat`) less
the time of the servers the sweep started (their process groups) and of this process (its request
threads). A round where others took at least BUSY_CORES cores on average is flagged `busy`. Unknown
(None) off Linux, and for an attached server, whose processes cannot be told from anyone else's.

A server keeps working after its last reply: vLLM's workers spin on their shared-memory queue for a second
after each read (`busy_loop_s` = 1, distributed/device_communicators/shm_broadcast.py `SpinCondition`), which
on 2 cores halved the next arm's tokens/s (measured: the target alone at 8 in flight 1000-1100 tok/s right
after the drafter's round, 2000-2400 after a pause). So before a timed window the sweep waits until the other
arm's server is quiet (`settle`), outside the window.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

BUSY_CORES = 0.5  # other programs' CPU during a round, in cores on average, from which the round is flagged
QUIET_CORES = 0.2  # a server using less than this (cores, over SETTLE_PROBE_S) is quiet
SETTLE_PROBE_S = 0.1
SETTLE_MOST_S = 5.0  # a server still busy after this long is measured beside anyway (the round's box says so)
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PROC = Path("/proc")


@dataclass(frozen=True)
class Sample:
    at: float  # time.perf_counter()
    load_average_1m: float
    box_busy_s: float | None  # CPU seconds every program has used since boot (None: no /proc)
    ours_s: float | None  # ... of which the sweep's servers and this process


@dataclass(frozen=True)
class Window:
    """One timed window's box: the larger load average at its ends, and other programs' CPU in cores."""

    load_average_1m: float
    others_cores: float | None

    @property
    def busy(self) -> bool | None:
        return None if self.others_cores is None else self.others_cores >= BUSY_CORES


def _box_busy_s() -> float | None:
    """Busy CPU seconds since boot over all cores: /proc/stat's first line less idle and iowait."""
    try:
        with open(_PROC / "stat", "rb") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 8 or fields[0] != b"cpu":
        return None
    ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICK


def _cpu_s(stat: bytes) -> tuple[int, float]:
    """(process group, user + system CPU seconds) from a /proc/<pid>/stat line; the command name (in
    parentheses, any bytes) is skipped through its last ')'."""
    rest = stat[stat.rindex(b")") + 2:].split()
    return int(rest[2]), (int(rest[11]) + int(rest[12])) / _TICK


def _ours_s(groups: Collection[int], with_self: bool = True) -> float | None:
    """CPU seconds of every process in `groups` (the servers' process groups) and of this process."""
    own = os.getpid() if with_self else -1
    total = 0.0
    try:
        entries = os.scandir(_PROC)
    except OSError:
        return None
    with entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(os.path.join(entry.path, "stat"), "rb") as f:
                    group, seconds = _cpu_s(f.read(4096))
            except (OSError, ValueError, IndexError):  # gone since the listing, or not a process's line
                continue
            if group in groups or int(entry.name) == own:
                total += seconds
    return total


def sample(groups: Collection[int] | None) -> Sample:
    """The box now, the sweep's own processes (`groups`: its servers' process groups; None: servers it did not
    start, so nobody's CPU can be told apart) told apart."""
    busy = _box_busy_s() if groups is not None else None
    return Sample(time.perf_counter(), os.getloadavg()[0], busy, _ours_s(groups) if busy is not None else None)


def window(start: Sample, end: Sample) -> Window:
    load = max(start.load_average_1m, end.load_average_1m)
    if None in (start.box_busy_s, end.box_busy_s, start.ours_s, end.ours_s) or end.at <= start.at:
        return Window(load, None)
    others = (end.box_busy_s - start.box_busy_s) - (end.ours_s - start.ours_s)
    return Window(load, max(0.0, others) / (end.at - start.at))


def settle(groups: Collection[int]) -> float:
    """Wait until the processes of `groups` (servers other than the one about to be timed) use less than
    QUIET_CORES, at most SETTLE_MOST_S; the seconds waited. Nothing to wait for off Linux."""
    start = time.perf_counter()
    if not groups:
        return 0.0
    while time.perf_counter() - start < SETTLE_MOST_S:
        before, t0 = _ours_s(groups, with_self=False), time.perf_counter()
        if before is None:  # no /proc
            break
        time.sleep(SETTLE_PROBE_S)
        after = _ours_s(groups, with_self=False)
        if after is None or (after - before) / (time.perf_counter() - t0) < QUIET_CORES:
            break
    return time.perf_counter() - start
