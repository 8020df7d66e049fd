"""workers remember the token that registered them

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23

Only that token (or an admin's) may heartbeat, claim, and report on the jobs the worker
holds. Workers registered before have no token: any worker token may still act for them
until they register again, as every ``tuner worker`` does when it starts.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("token_id", sa.Integer(), nullable=True))
        batch.create_foreign_key(
            "fk_workers_token_id_api_tokens",
            "api_tokens",
            ["token_id"],
            ["id"],
            ondelete="SET NULL",
        )
        batch.create_index("ix_workers_token_id", ["token_id"])


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_index("ix_workers_token_id")
        batch.drop_constraint("fk_workers_token_id_api_tokens", type_="foreignkey")
        batch.drop_column("token_id")
