"""The store's generation: a number raised by every write that can change an answer.

Write functions call :func:`mark_changed`; ``Database.session`` raises the generation
once, just before the transaction commits, so the row's lock is always taken last and
held for an instant (a bump in the middle of a transaction could deadlock two writers
on PostgreSQL). Readers compare the generation with the one their cache entries were
computed at: equal means nothing has changed since, in any process.
"""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy import Engine, update
from sqlalchemy.orm import Session

from api.models import StoreState

_CHANGED = "tuner_generation_changed"
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


class GenerationReader:
    """Reads the generation on one dedicated connection: a single indexed row, no ORM, no
    pool checkout, so a request pays tens of microseconds for knowing its cache is valid."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._connection: Any = None
        self._lock = threading.Lock()

    def read(self) -> int:
        with self._lock:
            try:
                return self._read()
            except Exception:
                # A dropped connection (a database restart): one fresh try, then give up.
                self._discard()
                return self._read()

    def _read(self) -> int:
        if self._connection is None:
            connection = self._engine.raw_connection()
            driver: Any = connection.driver_connection
            if self._engine.dialect.name != "sqlite":
                driver.autocommit = True  # each read sees the latest commit, holds no snapshot
            self._connection = connection
        cursor = self._connection.cursor()
        try:
            cursor.execute(_READ)
            row = cursor.fetchone()
        finally:
            cursor.close()
        if row is None:
            raise RuntimeError("store_state has no row: run `tuner db upgrade`")
        return int(row[0])

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
