"""Keyset pagination, newest first on ``(created_at, id)``: a page costs the same at any
depth, and rows written while someone pages never shift, duplicate or skip older ones."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol, TypeVar

from sqlalchemy import ColumnElement, Integer, func, literal, select, tuple_
from sqlalchemy.orm import InstrumentedAttribute, Session
from sqlalchemy.sql.base import ExecutableOption

from api.models import UTCDateTime
from tuner.core.wire.common import Cursor, PageQuery


class _Keyed(Protocol):
    @property
    def id(self) -> int: ...

    @property
    def created_at(self) -> datetime: ...


M = TypeVar("M", bound=_Keyed)


def keyset_page(
    session: Session,
    model: type[M],
    *,
    created_at: InstrumentedAttribute[Any],  # the time column rows are ordered by
    row_id: InstrumentedAttribute[int],
    where: Sequence[ColumnElement[bool]],
    query: PageQuery,
    options: Sequence[ExecutableOption] = (),
) -> tuple[list[M], int, str | None]:
    """One page of ``model`` rows matching ``where``, the total that match, and the token
    of the next page (None on the last)."""
    count = session.scalar(select(func.count()).select_from(model).where(*where)) or 0
    conditions = list(where)
    cursor = query.cursor
    if cursor is not None:
        # A row-value comparison, so both databases start an index range scan right there.
        conditions.append(
            tuple_(created_at, row_id)
            < tuple_(literal(cursor.created_at, UTCDateTime()), literal(cursor.id, Integer()))
        )
    statement: Any = (
        select(model)
        .where(*conditions)
        .order_by(created_at.desc(), row_id.desc())
        .limit(query.limit + 1)
        .options(*options)
    )
    rows: list[M] = list(session.scalars(statement).unique())
    if len(rows) <= query.limit:
        return rows, count, None
    last = rows[query.limit - 1]
    # The cursor holds the value of the ordering column, whichever it is.
    token = Cursor(created_at=getattr(last, created_at.key), id=last.id).encode()
    return rows[: query.limit], count, token
