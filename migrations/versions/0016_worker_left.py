"""workers record when they left on purpose

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26

A worker that stops because it was told to (`--exit-when-idle`, `--once`, SIGTERM) says so
before it exits; the jobs page then shows it as gone, not as a silent worker to worry
about. A worker stopped by SIGKILL or a crash cannot say so, and stays "silent".
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ALTER TABLE (see 0005).
    op.add_column("workers", sa.Column("left_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("workers", "left_at")
