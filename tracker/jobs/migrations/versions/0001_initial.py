"""The jobs table as draftboard first created it (before migrations existed).

A queue database made by that code has exactly this schema and no version table; the first
JobQueue to open it stamps it with this revision instead of creating anything.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_STATES = ("queued", "running", "succeeded", "failed", "cancelled")
_DEDUP_WHERE = "state IN ('queued', 'running', 'succeeded')"


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("command", sa.JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("worker_id", sa.String(255)),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True)),
        sa.Column("pid", sa.Integer),
        sa.Column("log_path", sa.Text),
        sa.Column("progress", sa.Float, nullable=False),
        sa.Column("stage", sa.String(255)),
        sa.Column("mlflow_run_id", sa.String(64)),
        sa.Column("error", sa.Text),
        sa.Column("cancel_requested", sa.Boolean, nullable=False),
        sa.Column("dedup_key", sa.String(64), nullable=False),
        sa.CheckConstraint("state IN (%s)" % ", ".join(f"'{s}'" for s in _STATES), name="ck_jobs_state"),
    )
    op.create_index("ix_jobs_state_id", "jobs", ["state", "id"])
    op.create_index(
        "ux_jobs_dedup_active",
        "jobs",
        ["dedup_key"],
        unique=True,
        sqlite_where=sa.text(_DEDUP_WHERE),
        postgresql_where=sa.text(_DEDUP_WHERE),
    )


def downgrade() -> None:
    op.drop_index("ux_jobs_dedup_active", table_name="jobs")
    op.drop_index("ix_jobs_state_id", table_name="jobs")
    op.drop_table("jobs")
