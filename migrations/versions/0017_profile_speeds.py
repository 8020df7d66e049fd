"""profiles keep the speed curve their answers compare splits by

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-26

After M* is found the engine times micro batches at a few sizes as training runs them
(`tuner.core.speeds.SpeedCurve`): the seconds per sample of each size in each round and
one optimizer step's seconds. The answer takes a split into more, smaller micro batches
when the curve has it faster by more than the rounds' spread. Profiles stored before have
none (NULL), and answer as they did.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ALTER TABLE (see 0005).
    op.add_column("profiles", sa.Column("speeds", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("profiles", "speeds")
