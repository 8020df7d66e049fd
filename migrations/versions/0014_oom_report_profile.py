"""an OOM report names the profile its plan came from

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26

A report sent with the recommendation it trained with names that recommendation's profile:
the report then attaches to the workload and device of that profile (the row the plan came
from), not to whichever row the reporter's name resolves to later. Rows stored before have
none and attach, as before, to the workload and device they named.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ALTER TABLE, never batch mode (see 0005), so no foreign key (SQLite cannot add
    # one to a table in place): the service checks the profile exists when it stores it.
    op.add_column("oom_reports", sa.Column("profile_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("oom_reports", "profile_id")
