"""Workers say which GPUs they hand out: `workers.gpus`, the ids a local worker pins its jobs to (`worker --gpus`,
tracker/jobs/gpus.py; null: it pins none).

Launch reads it to refuse, at submit, a job asking for more GPUs than any running worker has, instead of the job
failing at claim.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:  # SQLite alters a table by copying it
        batch.add_column(sa.Column("gpus", sa.JSON))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("gpus")
