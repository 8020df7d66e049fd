"""workers remember the token that registered them

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23

Only that token (or an admin's) may heartbeat, claim, and report on the jobs the worker
holds. Workers registered before have no token: any worker token may still act for them
until they register again, as every ``tuner worker`` does when it starts.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ALTER TABLE, never batch mode: SQLite's batch mode copies and drops the table,
    # and with foreign keys on, dropping workers would clear every job's worker. For the
    # same reason the id is a plain column, not a foreign key (tokens are revoked, never
    # deleted, so it always names one).
    op.add_column("workers", sa.Column("token_id", sa.Integer(), nullable=True))
    op.create_index("ix_workers_token_id", "workers", ["token_id"])


def downgrade() -> None:
    op.drop_index("ix_workers_token_id", table_name="workers")
    op.drop_column("workers", "token_id")
