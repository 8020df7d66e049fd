"""The store's generation: a number raised by every write that can change an answer.

Write functions call :func:`mark_changed`; ``Database.session`` raises the generation
once, just before the transaction commits, so the row's lock is always taken last and
held for an instant (a bump in the middle of a transaction could deadlock two writers
on PostgreSQL). Readers compare the generation with the one their cache entries were
computed at: equal means nothing has changed since, in any process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Engine, update
from sqlalchemy.orm import Session

from api.models import StoreState

_CHANGED = "tuner_generation_changed"
T = TypeVar("T")

_READ = "SELECT generation FROM store_state WHERE id = 1"


def mark_changed(session: Session) -> None:
    """This transaction changes what a recommendation or a token check could answer."""
    session.info[_CHANGED] = True


def bump_if_changed(session: Session) -> None:
    if session.info.pop(_CHANGED, False):
        session.execute(
            update(StoreState)
            .where(StoreState.id == 1)
            .values(generation=StoreState.generation + 1)
        )


class DirectReader:
    """One dedicated connection for the reads every request makes: the generation and, on
    SQLite, a fresh recommendation. No ORM, no pool checkout: a request pays tens of
    microseconds for knowing its cache is valid.

    On SQLite the reads run on the event loop itself (``inline``): a WAL reader never
    waits for a writer, and an indexed read of a local file takes less time than handing
    it to a thread and back. PostgreSQL is across a network, so its reads go to threads.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.dialect = engine.dialect
        self.inline = engine.dialect.name == "sqlite"
        self._connection: Any = None
        self._lock = threading.Lock()

    def generation(self) -> int:
        return self.run(_read_generation)

    def run(self, work: Callable[[Any], T]) -> T:
        """``work(dbapi_connection)``, each statement its own transaction (autocommit)."""
        with self._lock:
            try:
                return work(self._connect())
            except self.dialect.loaded_dbapi.Error:
                # A dropped connection (a database restart): one fresh try, then give up.
                self._discard()
                return work(self._connect())

    def _connect(self) -> Any:
        if self._connection is None:
            connection = self._engine.raw_connection()
            driver: Any = connection.driver_connection
            if self._engine.dialect.name != "sqlite":
                driver.autocommit = True  # each read sees the latest commit, holds no snapshot
            self._connection = connection
        return self._connection.driver_connection

    def _discard(self) -> None:
        if self._connection is not None:
            try:
                self._connection.invalidate()
            finally:
                self._connection = None

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None


def _read_generation(connection: Any) -> int:
    cursor = connection.cursor()
    try:
        cursor.execute(_READ)
        row = cursor.fetchone()
    finally:
        cursor.close()
    if row is None:
        raise RuntimeError("store_state has no row: run `tuner db upgrade`")
    return int(row[0])
