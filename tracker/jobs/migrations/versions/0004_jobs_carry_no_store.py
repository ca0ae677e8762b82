"""Jobs carry no store: strip `tracking_uri` from every row's params.

A job used to name the MLflow store its eval logs to, and the worker opened that URI at claim
time (to decide which drafters the job's training run registered, so trusted) and handed it to
the eval. A row could then point the worker at a listener that collected its MLflow password,
or at a store of the writer's making that "registered" a checkpoint outside the allowed roots.
From here on the worker uses its own configured store for everything (tracker/config.py); the
param is gone from the eval-job spec, so a row that still holds it would be refused. Rows queued
before this revision keep their other params and run against the worker's store.

A stripped row keeps its dedup key (computed with the old params); at worst one equivalent
submission queues a second time.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_jobs = sa.table("jobs", sa.column("id", sa.Integer), sa.column("params", sa.Text))


def upgrade() -> None:
    conn = op.get_bind()
    # Read as text: a row whose params are not a JSON object is left for the worker to refuse.
    for job_id, text in conn.execute(sa.select(_jobs.c.id, sa.cast(_jobs.c.params, sa.Text))).all():
        try:
            params = json.loads(text) if isinstance(text, str) else None
        except ValueError:
            continue
        if isinstance(params, dict) and "tracking_uri" in params:
            del params["tracking_uri"]
            conn.execute(sa.update(_jobs).where(_jobs.c.id == job_id).values(params=json.dumps(params)))


def downgrade() -> None:
    # The URIs are gone; older code logs such a job to its worker's default store.
    pass
