"""probes keep the memory timeline of their measured step

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-26

The probe at a profile's M* carries live bytes over its measured step, operator by
operator, with the phases of the step and the peak (``tuner.core.timeline``; at most 1024
points, about 96 KB as JSON at worst). Probes stored before have none: the profile page
says so, and their profiles read as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ALTER TABLE (see 0005).
    op.add_column("probes", sa.Column("timeline", sa.JSON(), nullable=True))


def downgrade() -> None:
    # The probes stay; only their timelines go.
    op.drop_column("probes", "timeline")
