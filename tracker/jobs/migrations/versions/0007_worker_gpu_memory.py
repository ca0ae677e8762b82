"""Workers say how much memory each of their GPUs has: `workers.gpu_memory` in bytes (`worker --gpu-memory 80GiB` or
DRAFTBOARD_GPU_MEMORY; null: not declared).

Launch reads it to refuse, at submit, a job whose target's weights alone exceed the memory of the GPUs it asks for,
instead of the eval running out of memory on a worker.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:  # SQLite alters a table by copying it
        batch.add_column(sa.Column("gpu_memory", sa.BigInteger))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("gpu_memory")
