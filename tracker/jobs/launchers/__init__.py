"""How `draftboard worker` runs a claimed job: as a local subprocess, or as a Ray job.

- `base`: the Launcher / Execution interfaces and JobOutput (a job's log, progress, result);
- `local`: LocalLauncher, a subprocess of the worker (the default);
- `ray`: RayLauncher, a job on a Ray cluster through the Jobs API (docs/RAY.md).

Whichever runs it, a job's argv is built by the worker from the job's params; a launcher adds
only its `entry`, the command that runs draftboard's CLI where the job runs.
"""

from __future__ import annotations

from typing import Any

from tracker.errors import DraftboardError
from tracker.jobs.launchers.base import Launcher
from tracker.jobs.launchers.local import LocalLauncher

LAUNCHERS = ("local", "ray")


def make_launcher(name: str = "local", address: str | None = None, **ray_options: Any) -> Launcher:
    """The launcher called name (`local` or `ray`); address and ray_options go to RayLauncher."""
    if name == "local":
        return LocalLauncher()
    if name == "ray":
        from tracker.jobs.launchers.ray import RayLauncher  # Ray's client only when asked for

        return RayLauncher(address, **ray_options)
    raise DraftboardError(f"unknown launcher {name!r}; use {' or '.join(LAUNCHERS)}")
