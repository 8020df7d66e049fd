"""workloads and devices record the token that registered them; CPU device names
show their memory limit

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24

A name belongs to the registrant of its first row and resolves among that registrant's
rows only (``api.store.names``). Rows stored before have no registrant (NULL): a name
first stored before this revision stays with the rows stored then.

Each CPU memory limit is its own device; their names were all the machine's (``x86_64``),
so a name matched every limit. A CPU device is now named with its limit
(``x86_64 (128 MiB limit)``, ``tuner.core.units.limited_name``), and so is a
GPU run under a limit below its card's memory; stored rows are renamed the same way (a
device's key is unchanged, so new uploads find them). Downgrade takes the suffix off.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from tuner.core.units import limited_name

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_devices = sa.table(
    "devices",
    sa.column("id", sa.Integer),
    sa.column("kind", sa.String),
    sa.column("name", sa.String),
    sa.column("capacity_bytes", sa.BigInteger),
    sa.column("details", sa.JSON),
)


def upgrade() -> None:
    # Plain ALTER TABLE, never batch mode: profiles reference workloads and devices, and
    # SQLite's batch mode copies and drops the table, which with foreign keys on cascades.
    for table in ("workloads", "devices"):
        op.add_column(table, sa.Column("registered_by", sa.Integer(), nullable=True))
    connection = op.get_bind()
    for row in connection.execute(sa.select(_devices)).all():
        limit = _limit_of(row.kind, row.details or {}, row.capacity_bytes)
        renamed = limited_name(row.name, limit)
        if renamed != row.name:
            connection.execute(
                _devices.update().where(_devices.c.id == row.id).values(name=renamed)
            )


def downgrade() -> None:
    connection = op.get_bind()
    for row in connection.execute(sa.select(_devices)).all():
        limit = _limit_of(row.kind, row.details or {}, row.capacity_bytes)
        suffix = limited_name("", limit)
        if suffix and row.name.endswith(suffix):
            connection.execute(
                _devices.update()
                .where(_devices.c.id == row.id)
                .values(name=row.name[: -len(suffix)])
            )
    for table in ("devices", "workloads"):
        op.drop_column(table, "registered_by")


def _limit_of(kind: str, details: dict[str, object], capacity_bytes: int) -> int | None:
    """The limit a device row was measured under, as its backend names it: a CPU's is its
    capacity; a GPU's only when below the card's memory."""
    if kind == "cpu":
        return capacity_bytes
    limit, total = details.get("memory_limit_bytes"), details.get("total_memory_bytes")
    if isinstance(limit, int) and isinstance(total, int) and limit < total:
        return limit
    return None
