"""The PostgreSQL / MLflow server a benchmark measures: the running ones the environment names
(scripts/services.sh's DRAFTBOARD_TEST_* variables), else a throwaway set started here with
scripts/services.sh and stopped when the benchmark ends."""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import subprocess
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ROOT / "scripts" / "services.sh"


@contextlib.contextmanager
def services(postgres_only: bool = False) -> Iterator[dict[str, str]]:
    """DRAFTBOARD_TEST_* values (PG_URI; with the server also SERVER_URI, ADMIN_USER, ADMIN_PASSWORD)."""
    wanted = ["DRAFTBOARD_TEST_PG_URI"]
    if not postgres_only:
        wanted += ["DRAFTBOARD_TEST_SERVER_URI", "DRAFTBOARD_TEST_ADMIN_USER", "DRAFTBOARD_TEST_ADMIN_PASSWORD"]
    if all(os.environ.get(name) for name in wanted):
        yield {name: os.environ[name] for name in wanted}
        return
    args = ["bash", str(SERVICES), "start"] + (["--postgres-only"] if postgres_only else [])
    env = {k: v for k, v in os.environ.items() if k != "DRAFTBOARD_SERVICES_DIR"}  # ours, to stop
    printed = subprocess.run(args, check=True, capture_output=True, text=True, cwd=ROOT, env=env).stdout
    values = {}
    for line in printed.splitlines():  # export NAME=value (shell-quoted)
        name, _, value = line.removeprefix("export ").partition("=")
        values[name] = shlex.split(value)[0] if value else ""
    try:
        yield values
    finally:
        subprocess.run(["bash", str(SERVICES), "stop", values["DRAFTBOARD_SERVICES_DIR"]], check=False,
                       capture_output=True, cwd=ROOT)


@contextlib.contextmanager
def postgres_schema(uri: str) -> Iterator[str]:
    """`uri` with a fresh schema of its own as search_path; the schema is dropped afterwards."""
    import sqlalchemy as sa

    from tracker.jobs.queue import engine_url

    schema = f"bench_{secrets.token_hex(6)}"
    admin = sa.create_engine(engine_url(uri), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{uri}{'&' if '?' in uri else '?'}options=-csearch_path%3D{schema}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def postgres_settings(uri: str) -> str:
    """The server settings that decide commit cost, for the report (a throwaway cluster runs without fsync)."""
    import sqlalchemy as sa

    from tracker.jobs.queue import engine_url

    engine = sa.create_engine(engine_url(uri))
    try:
        with engine.connect() as conn:
            values = {name: conn.execute(sa.text(f"SHOW {name}")).scalar()
                      for name in ("server_version", "fsync", "synchronous_commit")}
    finally:
        engine.dispose()
    return ", ".join(f"{k}={v}" for k, v in values.items())
