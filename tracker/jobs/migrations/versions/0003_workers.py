"""Workers say what they can run: one row per live worker, with the devices its jobs can use.

The Launch form reads it to refuse, at submit, a job no worker could run (`cuda` where every
worker has a CPU-only torch), instead of the job failing minutes later in a worker's slot.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("id", sa.String(255), primary_key=True),
        sa.Column("devices", sa.JSON),  # null: the worker's launcher cannot tell (e.g. a Ray cluster)
        sa.Column("launcher", sa.Text, nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("workers")
