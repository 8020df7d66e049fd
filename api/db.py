"""The one way to a database session: commit on success, roll back on error, always close.

SQLite gets WAL (readers never wait for the writer), a busy timeout (writers queue instead
of failing with "database is locked"), foreign keys, and ``BEGIN IMMEDIATE`` for write
sessions (the write lock is taken up front, so two writers never deadlock upgrading a read
lock). PostgreSQL goes through psycopg 3.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker

from api.store.generation import bump_if_changed
from tuner.core.errors import BadInputError

SQLITE_BUSY_TIMEOUT_MS = 30_000


def normalize_url(url: str) -> URL:
    """Parse a database URL; plain ``postgresql://`` means psycopg 3."""
    try:
        parsed = make_url(url)
    except Exception:
        raise BadInputError(
            f"cannot read database URL {url!r}: use sqlite:///path/to/file.db or "
            "postgresql://user:password@host/dbname"
        ) from None
    backend = parsed.get_backend_name()
    if backend == "postgresql" and parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    elif backend not in ("sqlite", "postgresql"):
        raise BadInputError(f"unsupported database {backend!r}: use sqlite or postgresql")
    return parsed


def create_db_engine(url: str) -> Engine:
    parsed = normalize_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(parsed, pool_pre_ping=True, pool_size=10, max_overflow=20)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        parsed,
        connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False},
        pool_size=20,
        max_overflow=20,
    )

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        # The driver's own transaction handling would BEGIN late and DEFERRED; we begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        write = connection.get_execution_options().get("tuner_write", False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


class Database:
    """An engine and its read and write session factories."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = create_db_engine(url)
        self._read = sessionmaker(self.engine, expire_on_commit=False)
        self._write = sessionmaker(
            self.engine.execution_options(tuner_write=True), expire_on_commit=False
        )

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def session(self, *, write: bool = False) -> Iterator[Session]:
        """A transaction: committed when the block ends, rolled back if it raises."""
        session = (self._write if write else self._read)()
        try:
            yield session
            bump_if_changed(session)
            session.commit()
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def dispose(self) -> None:
        self.engine.dispose()
