"""projects: every row belongs to one, and a key is unique within its project

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26

A service shared by teams keeps each team's evidence apart: workloads, devices, jobs,
workers and OOM reports get a ``project_id`` (profiles and probes belong to their
workload's), and tokens one too (NULL: every project, for admin tokens). Everything
stored before belongs to the project ``default`` (id 1), and so does every token but the
admin tokens, which keep seeing everything: a one-team setup notices nothing.

Workload and device keys were unique across the store; they become unique within a
project, so that two teams profiling the same model each get their own row. On SQLite a
unique constraint cannot be dropped in place: ``workloads`` and ``devices`` are rebuilt
(batch mode), which is safe only with foreign keys off, since dropping the old table
would otherwise cascade to every profile (see 0005). ``api/migrations/env.py`` turns them
off around SQLite migrations; this revision checks that they are, and that no reference
broke, before it commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OWNED = ("workloads", "devices", "jobs", "workers", "oom_reports")
_KEYED = ("workloads", "devices")


def upgrade() -> None:
    projects = op.create_table(
        "projects",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_projects")),
        sa.UniqueConstraint("name", name=op.f("uq_projects_name")),
    )
    # No id given, so that PostgreSQL's sequence counts it: the first row of a new table is 1.
    op.bulk_insert(projects, [{"name": "default", "created_at": datetime.now(UTC)}])
    for table in _OWNED:
        op.add_column(
            table, sa.Column("project_id", sa.Integer(), nullable=False, server_default="1")
        )
        op.create_index(op.f(f"ix_{table}_project_id"), table, ["project_id"])
    op.add_column("api_tokens", sa.Column("project_id", sa.Integer(), nullable=True))
    tokens = sa.table("api_tokens", sa.column("scopes", sa.String), sa.column("project_id"))
    op.execute(tokens.update().where(~tokens.c.scopes.contains("admin")).values(project_id=1))
    _swap_unique(("key",), ("project_id", "key"))


def downgrade() -> None:
    # Keys are unique across the store again: refused while two projects share one.
    bind = op.get_bind()
    for table in _KEYED:
        shared = bind.execute(
            sa.text(f"SELECT key FROM {table} GROUP BY key HAVING COUNT(*) > 1 LIMIT 1")
        ).scalar()
        if shared is not None:
            raise RuntimeError(
                f"two projects have a {table[:-1]} keyed {shared!r}: before projects a key "
                "was unique across the store; delete one of them before downgrading"
            )
    _swap_unique(("project_id", "key"), ("key",))
    for table in _OWNED:
        op.drop_index(op.f(f"ix_{table}_project_id"), table_name=table)
        op.drop_column(table, "project_id")
    op.drop_column("api_tokens", "project_id")
    op.drop_table("projects")


def _swap_unique(old: tuple[str, ...], new: tuple[str, ...]) -> None:
    bind = op.get_bind()
    for table in _KEYED:
        old_name, new_name = op.f(f"uq_{table}_{old[0]}"), op.f(f"uq_{table}_{new[0]}")
        if bind.dialect.name != "sqlite":
            op.drop_constraint(old_name, table, type_="unique")
            op.create_unique_constraint(new_name, table, list(new))
            continue
        if bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
            raise RuntimeError(
                "rebuilding a table with foreign keys on would delete every profile: run "
                "this revision through `tuner db upgrade`, which turns them off"
            )
        with op.batch_alter_table(table, recreate="always") as batch:
            batch.drop_constraint(old_name, type_="unique")
            batch.create_unique_constraint(new_name, list(new))
    if bind.dialect.name == "sqlite":
        broken = bind.exec_driver_sql("PRAGMA foreign_key_check").first()
        if broken is not None:
            raise RuntimeError(f"a reference broke while rebuilding {broken[0]}: {tuple(broken)}")
