"""idempotency keys belong to the token that sent them; jobs and workers take them too

Revision ID: 0011
Revises: 0009
Create Date: 2026-11-24

An idempotency key names one request of one token: ``(token_id, idempotency_key)`` is
unique, and the digest of the request's body is kept beside it, so that a replay with the
same body returns what the first request stored and any other body is refused. OOM
reports gain the token (their keys were unique across all tokens: reports stored before
keep their keys under no token); jobs and worker registrations gain key and digest, and
jobs the token that queued them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _key_columns() -> list[sa.Column[str]]:
    return [
        sa.Column("idempotency_key", sa.String(length=64), nullable=True),
        sa.Column("request_digest", sa.String(length=64), nullable=True),
    ]


def upgrade() -> None:
    # oom_reports is referenced by nothing, so batch mode (SQLite copies the table) is
    # safe there; jobs and workers are referenced, and take plain ALTER TABLE only (see
    # 0007).
    with op.batch_alter_table("oom_reports") as batch:
        batch.drop_constraint("uq_oom_reports_idempotency_key", type_="unique")
        batch.add_column(sa.Column("token_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("request_digest", sa.String(length=64), nullable=True))
    op.create_index(
        "ix_oom_reports_token_idempotency",
        "oom_reports",
        ["token_id", "idempotency_key"],
        unique=True,
    )
    op.add_column("jobs", sa.Column("token_id", sa.Integer(), nullable=True))
    for column in _key_columns():
        op.add_column("jobs", column)
    op.create_index(
        "ix_jobs_token_idempotency", "jobs", ["token_id", "idempotency_key"], unique=True
    )
    for column in _key_columns():
        op.add_column("workers", column)
    op.create_index(
        "ix_workers_token_idempotency", "workers", ["token_id", "idempotency_key"], unique=True
    )


def downgrade() -> None:
    op.drop_index("ix_workers_token_idempotency", table_name="workers")
    op.drop_column("workers", "request_digest")
    op.drop_column("workers", "idempotency_key")
    op.drop_index("ix_jobs_token_idempotency", table_name="jobs")
    op.drop_column("jobs", "request_digest")
    op.drop_column("jobs", "idempotency_key")
    op.drop_column("jobs", "token_id")
    op.drop_index("ix_oom_reports_token_idempotency", table_name="oom_reports")
    # Keys were unique across tokens before: a key two tokens used stays with its first.
    op.execute(
        "UPDATE oom_reports SET idempotency_key = NULL WHERE idempotency_key IS NOT NULL "
        "AND id > (SELECT MIN(first.id) FROM oom_reports AS first "
        "WHERE first.idempotency_key = oom_reports.idempotency_key)"
    )
    with op.batch_alter_table("oom_reports") as batch:
        batch.drop_column("request_digest")
        batch.drop_column("token_id")
        batch.create_unique_constraint("uq_oom_reports_idempotency_key", ["idempotency_key"])
