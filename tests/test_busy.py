"""evaluators/engines/busy.py: what other programs took of the box during a timed window, told apart from the
sweep's own servers by their process groups (real processes, /proc as Linux writes it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from evaluators.engines import busy
from waiting import wait_until

SPIN = "import time\nt = time.perf_counter()\nwhile time.perf_counter() - t < 30: pass\n"


def spinning(proc: subprocess.Popen, seconds: float = 0.05) -> int:
    """The process group of `proc`, once it has spent `seconds` of CPU (it spins: it started)."""
    group = os.getpgid(proc.pid)
    wait_until(lambda: busy._ours_s([group], with_self=False) >= seconds, 10, what="the spinner spinning")
    return group


def test_a_process_line_is_read_past_any_command_name():
    """The command name sits in parentheses and may hold spaces and ')': fields are counted after the last one."""
    tick = busy._TICK
    line = f"4242 (we) ird (x) R 1 777 777 0 -1 4194560 0 0 0 0 {3 * tick} {2 * tick} 0 0 20 0 1 0".encode()
    assert busy._cpu_s(line) == (777, 5.0)


def test_a_window_is_other_programs_cpu_over_its_wall_time():
    start = busy.Sample(at=10.0, load_average_1m=1.5, box_busy_s=100.0, ours_s=40.0)
    end = busy.Sample(at=12.0, load_average_1m=2.5, box_busy_s=104.0, ours_s=42.5)  # 4 s busy, 2.5 of them ours
    window = busy.window(start, end)
    assert window == busy.Window(2.5, 0.75) and window.busy is True
    assert busy.window(start, busy.Sample(12.0, 1.0, 101.0, 40.9)).busy is False  # 0.05 cores
    assert busy.window(start, busy.Sample(12.0, 1.0, None, None)).busy is None  # unknown, never a guess


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads Linux's /proc")
def test_a_spinning_program_is_someone_elses_unless_it_is_one_of_the_sweeps_servers():
    spinner = subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True)
    try:
        group = spinning(spinner)
        before_theirs, before_ours = busy.sample([]), busy.sample([group])
        spent = busy._ours_s([group], with_self=False)
        # the window: until the spinner has taken another CPU second
        wait_until(lambda: busy._ours_s([group], with_self=False) >= spent + 1.0, 20, what="a CPU second spun")
        theirs = busy.window(before_theirs, busy.sample([]))
        ours = busy.window(before_ours, busy.sample([group]))
    finally:
        spinner.kill()
        spinner.wait()
    assert theirs.others_cores > 0.6 and theirs.busy  # a core, less what the box's scheduler gave elsewhere
    assert ours.others_cores < theirs.others_cores - 0.5
    assert busy.sample(None).box_busy_s is None  # servers it did not start: nobody's CPU told apart


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads Linux's /proc")
def test_settling_waits_for_a_server_that_still_works_and_no_longer(monkeypatch):
    """A program that works 0.6 s more is waited for (about that long); one that never stops is measured beside
    after SETTLE_MOST_S; nothing to wait for without servers."""
    assert busy.settle([]) == 0.0
    brief = subprocess.Popen([sys.executable, "-c", SPIN.replace("< 30", "< 0.6")], start_new_session=True)
    try:
        waited = busy.settle([spinning(brief)])
    finally:
        brief.wait()
    assert 0.2 < waited < 2.0
    monkeypatch.setattr(busy, "SETTLE_MOST_S", 0.5)
    endless = subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True)
    try:
        assert 0.5 <= busy.settle([spinning(endless)]) < 1.0
    finally:
        endless.kill()
        endless.wait()
