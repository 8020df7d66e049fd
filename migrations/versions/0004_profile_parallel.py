"""profiles carry their world size and parallel mode; probes their per-rank peaks

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23

Rows stored before are one-process profiles: ``world_size = 1`` and ``parallel = none``.
``parallel_mode`` repeats the mode of the ``parallel`` document as a plain column, so that
a recommendation filters on it and an index can hold it; a workload's mode (part of its
key when not none) lets a name shared by a one-process and a DDP workload be told apart.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What every row stored before this revision was measured as.
_ONE_PROCESS = sa.text('\'{"mode": "none"}\'')
_NONE = sa.text("'none'")
_EMPTY_LIST = sa.text("'[]'")


def upgrade() -> None:
    # Plain ALTER TABLE on both databases, never batch mode: SQLite's batch mode copies and
    # drops the table, and with foreign keys on, dropping workloads or profiles would
    # cascade to every profile and probe.
    op.add_column(
        "workloads",
        sa.Column("parallel_mode", sa.String(length=8), nullable=False, server_default=_NONE),
    )
    op.add_column(
        "profiles",
        sa.Column("world_size", sa.Integer(), nullable=False, server_default=sa.text("1")),
    )
    op.add_column(
        "profiles",
        sa.Column("parallel_mode", sa.String(length=8), nullable=False, server_default=_NONE),
    )
    op.add_column(
        "profiles", sa.Column("parallel", sa.JSON(), nullable=False, server_default=_ONE_PROCESS)
    )
    op.create_index(
        "ix_profiles_workload_device_world_created",
        "profiles",
        ["workload_id", "device_id", "world_size", "created_at"],
    )
    for name in ("rank_peaks_bytes", "rank_breakdowns"):
        op.add_column(
            "probes", sa.Column(name, sa.JSON(), nullable=False, server_default=_EMPTY_LIST)
        )


def downgrade() -> None:
    # Without the columns a multi-rank profile would read as a one-process one and answer
    # for runs it does not describe: such profiles go, with their probes.
    multi_rank = "world_size <> 1 OR parallel_mode <> 'none'"
    op.execute(
        f"DELETE FROM probes WHERE profile_id IN (SELECT id FROM profiles WHERE {multi_rank})"
    )
    op.execute(f"DELETE FROM profiles WHERE {multi_rank}")
    for name in ("rank_breakdowns", "rank_peaks_bytes"):
        op.drop_column("probes", name)
    op.drop_index("ix_profiles_workload_device_world_created", table_name="profiles")
    for name in ("parallel", "parallel_mode", "world_size"):
        op.drop_column("profiles", name)
    op.drop_column("workloads", "parallel_mode")
