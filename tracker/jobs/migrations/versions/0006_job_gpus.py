"""Jobs say which GPUs they hold: `jobs.gpus`, the ids a local worker gave the job's process (its
CUDA_VISIBLE_DEVICES, tracker/jobs/gpus.py); null where the worker pins none.

Launch's running cards name them, so two evals on one box read as on GPU 0 and on GPU 1.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:  # SQLite alters a table by copying it
        batch.add_column(sa.Column("gpus", sa.JSON))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("gpus")
