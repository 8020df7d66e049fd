"""profiles carry the time the service received them, which orders and compares them

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23

``created_at`` is the measuring machine's clock: an hour fast, a profile would stay the
newest for an hour and ignore every OOM reported meanwhile; an hour slow, it could never
lift an OOM reported before it arrived. ``received_at`` is the service's clock, set when
the row is stored; which profile is newest, and whether an OOM report is newer than a
profile, are decided by it. Rows stored before take their ``created_at``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INDEXES = {
    "ix_profiles_received_id": ["received_at", "id"],
    "ix_profiles_workload_received_id": ["workload_id", "received_at", "id"],
    "ix_profiles_device_received_id": ["device_id", "received_at", "id"],
    "ix_profiles_workload_device_world_received": [
        "workload_id",
        "device_id",
        "world_size",
        "received_at",
    ],
}


def upgrade() -> None:
    # Plain ALTER TABLE, never batch mode: SQLite's batch mode copies and drops profiles,
    # and with foreign keys on that would cascade to every probe.
    op.add_column("profiles", sa.Column("received_at", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE profiles SET received_at = created_at")
    for name, columns in _INDEXES.items():
        op.create_index(name, "profiles", columns)


def downgrade() -> None:
    for name in _INDEXES:
        op.drop_index(name, table_name="profiles")
    op.drop_column("profiles", "received_at")
