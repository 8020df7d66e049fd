"""Alembic environment: the URL and (optionally) a connection come from api.migrate."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from alembic import context
from sqlalchemy.engine import Connection

from api.db import create_db_engine
from api.models import Base

config = context.config


def _run(connection: Connection) -> None:
    if connection.dialect.name == "sqlite":
        # SQLite changes most of a table's schema by copying it (batch mode), and dropping
        # the old copy with foreign keys on would cascade to every row that refers to it.
        # The pragma is a no-op inside a transaction, so it goes to the driver before
        # alembic begins one; revisions that copy tables check it, and what they leave.
        with _foreign_keys(connection, on=False):
            _migrate(connection)
        return
    _migrate(connection)


@contextmanager
def _foreign_keys(connection: Connection, *, on: bool) -> Iterator[None]:
    raw = connection.connection.dbapi_connection
    assert raw is not None
    raw.execute(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")
    try:
        yield
    finally:
        raw.execute(f"PRAGMA foreign_keys={'OFF' if on else 'ON'}")


def _migrate(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        # SQLite cannot ALTER most things; batch mode copies the table instead.
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_db_engine(config.attributes["url"])
    try:
        with engine.connect() as connection:
            _run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported; run `tuner db upgrade`")
run_migrations_online()
