"""profiles carry their mesh's tensor-parallel degree, which answers filter on

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-24

A profile measured on a 2-D mesh of ``dp × tp`` ranks keeps ``tp`` in its ``parallel``
JSON; profiles of one workload at (4, 1), (2, 2) and (1, 4) share the workload key and the
world size 4, so the newest profile at a mesh shape is found by ``(world_size, tp)``. The
column repeats ``parallel.tp`` for that index. Rows stored before are of no mesh: 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD_INDEX = ("ix_profiles_workload_device_world_received", ["world_size", "received_at"])
_NEW_INDEX = ("ix_profiles_workload_device_world_tp_received", ["world_size", "tp", "received_at"])


def upgrade() -> None:
    # Plain ALTER TABLE, never batch mode: SQLite's batch mode copies and drops profiles,
    # and with foreign keys on that cascades to every probe (see 0005).
    op.add_column("profiles", sa.Column("tp", sa.Integer(), nullable=False, server_default="1"))
    op.drop_index(_OLD_INDEX[0], table_name="profiles")
    op.create_index(_NEW_INDEX[0], "profiles", ["workload_id", "device_id", *_NEW_INDEX[1]])


def downgrade() -> None:
    # The profiles stay; their tp stays in their parallel JSON.
    op.drop_index(_NEW_INDEX[0], table_name="profiles")
    op.create_index(_OLD_INDEX[0], "profiles", ["workload_id", "device_id", *_OLD_INDEX[1]])
    op.drop_column("profiles", "tp")
