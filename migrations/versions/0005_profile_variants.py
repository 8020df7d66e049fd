"""profiles carry the variant they measured and the group of an exploration

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23

``tuner profile --explore`` profiles each variant a workload declares (checkpointing,
precision, ...); ``variant`` holds the options of one, ``variant_group`` the key its
exploration's profiles share, indexed so that a profile's variants are one lookup. Rows
stored before are no variant of anything: ``{}`` and no group.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ALTER TABLE, never batch mode: SQLite's batch mode copies and drops profiles,
    # and with foreign keys on that cascades to every probe.
    op.add_column(
        "profiles",
        sa.Column("variant", sa.JSON(), nullable=False, server_default=sa.text("'{}'")),
    )
    op.add_column("profiles", sa.Column("variant_group", sa.String(length=64), nullable=True))
    op.create_index("ix_profiles_variant_group", "profiles", ["variant_group"])


def downgrade() -> None:
    # The profiles stay: each is still a whole profile of its own workload; only the link
    # between variants goes.
    op.drop_index("ix_profiles_variant_group", table_name="profiles")
    op.drop_column("profiles", "variant_group")
    op.drop_column("profiles", "variant")
