"""profiles say which variant their exploration chose

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24

``tuner profile --explore --upload`` stores every variant's profile; ``variant_chosen``
marks the one it chose, the variant whose plan for the global batch ran fastest in a timed
step (without a global batch, the fastest at its own M*). That choice is made from
timings the store never sees, so it is kept as sent. Rows stored before are chosen by
nobody: the choice was not kept, and guessing it from the speed at M* would mark the
variant the timed plans may well have passed over.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ALTER TABLE, never batch mode: SQLite's batch mode copies and drops profiles,
    # and with foreign keys on that cascades to every probe (see 0005).
    op.add_column(
        "profiles",
        sa.Column("variant_chosen", sa.Boolean(), nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    # The profiles stay, each a whole profile of its variant; only the mark goes.
    op.drop_column("profiles", "variant_chosen")
