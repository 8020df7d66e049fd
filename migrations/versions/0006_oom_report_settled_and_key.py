"""OOM reports carry the size the run settled on and the reporter's idempotency key

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23

``settled_micro_batch_size``: the size a training run went on with after running out of
memory (answers stay at or below it, rather than one below the failed size, which no
run has shown to fit). ``idempotency_key``: chosen by the reporter for one event and
stored unique, so that a retried request, or the same event from another rank, is
counted once. Rows stored before have neither.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("oom_reports") as batch:
        batch.add_column(sa.Column("settled_micro_batch_size", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("idempotency_key", sa.String(length=64), nullable=True))
        batch.create_unique_constraint("uq_oom_reports_idempotency_key", ["idempotency_key"])


def downgrade() -> None:
    with op.batch_alter_table("oom_reports") as batch:
        batch.drop_constraint("uq_oom_reports_idempotency_key", type_="unique")
        batch.drop_column("idempotency_key")
        batch.drop_column("settled_micro_batch_size")
