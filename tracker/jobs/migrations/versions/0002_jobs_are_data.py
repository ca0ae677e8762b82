"""Jobs are data: drop the stored argv (`command`); a job is its kind and params only.

Queues made before this stored the argv each job would run, and workers ran it as stored, so
whoever could write to the database could run any command on every worker. From here on the
worker builds the argv itself from the params (tracker/jobs/eval_job.py), and a stored command
is never executed again: the column goes, with what it held. Queued rows keep their kind and
params; a worker runs them from those params, and fails (with the reason) any row whose kind
is unknown or whose params do not validate, before starting anything.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # SQLite >= 3.35 (which the queue needs for RETURNING anyway) drops a column in place.
    op.drop_column("jobs", "command")


def downgrade() -> None:
    # The argv is gone; older code finds an empty one, which it cannot start (the job fails).
    op.add_column("jobs", sa.Column("command", sa.JSON, nullable=False, server_default="[]"))
