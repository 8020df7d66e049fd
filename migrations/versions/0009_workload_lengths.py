"""workloads carry their sequence length and the family of lengths they belong to

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24

A workload built for one sequence length has that length in its key (through the input
shapes); the workloads that differ only in length share a ``length_family`` key, and a
question for a length nobody profiled is answered from the family's measured lengths.
Rows stored before have neither: they answer for their own shape only, as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ALTER TABLE, never batch mode: profiles reference workloads, and SQLite's batch
    # mode copies and drops the table, which with foreign keys on cascades to them.
    op.add_column("workloads", sa.Column("seq_len", sa.Integer(), nullable=True))
    op.add_column("workloads", sa.Column("length_family", sa.String(64), nullable=True))
    op.create_index("ix_workloads_length_family", "workloads", ["length_family"])


def downgrade() -> None:
    op.drop_index("ix_workloads_length_family", table_name="workloads")
    op.drop_column("workloads", "length_family")
    op.drop_column("workloads", "seq_len")
