"""profile indexes for listing, newest-per-pair and idempotent uploads

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22

Listing pages newest first on (created_at, id), unfiltered or by workload or device; the
newest profile of a (workload, device) pair is one probe of a unique index, which also
recognises an upload sent twice.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_profiles_workload_device_created", table_name="profiles")
    op.drop_index("ix_profiles_device_id", table_name="profiles")
    op.drop_index("ix_profiles_created_at", table_name="profiles")
    op.create_index(
        "uq_profiles_workload_device_created",
        "profiles",
        ["workload_id", "device_id", "created_at"],
        unique=True,
    )
    op.create_index("ix_profiles_created_id", "profiles", ["created_at", "id"])
    op.create_index(
        "ix_profiles_workload_created_id", "profiles", ["workload_id", "created_at", "id"]
    )
    op.create_index("ix_profiles_device_created_id", "profiles", ["device_id", "created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_profiles_device_created_id", table_name="profiles")
    op.drop_index("ix_profiles_workload_created_id", table_name="profiles")
    op.drop_index("ix_profiles_created_id", table_name="profiles")
    op.drop_index("uq_profiles_workload_device_created", table_name="profiles")
    op.create_index("ix_profiles_created_at", "profiles", ["created_at"])
    op.create_index("ix_profiles_device_id", "profiles", ["device_id"])
    op.create_index(
        "ix_profiles_workload_device_created",
        "profiles",
        ["workload_id", "device_id", "created_at"],
    )
