"""Alembic environment of the job queue's schema (the `jobs` table of `tracker.jobs.queue`).

`tracker.jobs.queue.JobQueue` runs these migrations itself when it opens a queue (`upgrade_schema`),
passing its connection in `config.attributes["connection"]`. For a developer writing the next
revision, the alembic CLI works too:

    alembic -c tracker/jobs/migrations/alembic.ini -x url=sqlite:////tmp/jobs.db upgrade head
    alembic -c tracker/jobs/migrations/alembic.ini -x url=sqlite:////tmp/jobs.db revision --autogenerate -m "what changes"

Revisions describe history: they spell out their tables and constants instead of importing
them from `tracker.jobs.queue`, whose definitions follow the newest revision.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from tracker.jobs.schema import VERSION_TABLE, metadata

config = context.config


def _configure(**kwargs) -> None:
    context.configure(
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        compare_type=True,
        **kwargs,
    )


def _run_with(connection: sa.Connection) -> None:
    # SQLite cannot ALTER most things in place: batch mode copies the table instead.
    _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("give the queue's database: alembic -x url=sqlite:///path/jobs.db ...")
    return url


if context.is_offline_mode():
    _configure(url=_url(), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif config.attributes.get("connection") is not None:
    _run_with(config.attributes["connection"])  # JobQueue's connection, inside its lock
else:
    engine = sa.create_engine(_url())
    try:
        with engine.begin() as conn:
            _run_with(conn)
    finally:
        engine.dispose()
