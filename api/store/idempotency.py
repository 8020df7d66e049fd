"""Idempotency keys: a client names one request with a key of its choosing, so that sending
it again (a retry after a lost response) does not do it twice.

A key belongs to the token that sent it: ``(token_id, idempotency_key)`` is unique per
table, and another token's use of the same key is another request. Beside the key the
store keeps the SHA-256 of the request's body (its fields as JSON, keys sorted, the key
itself left out). The same token sending the same key again is answered with what the
first request stored when the bodies' digests agree (a replay: 200), and refused with a
409 when they differ in anything, so a reused key never silently drops a request.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Protocol, TypeVar

from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import InstrumentedAttribute, Session

from tuner.core.errors import ConflictError


class _Keyed(Protocol):
    id: int
    token_id: int | None
    idempotency_key: str | None
    request_digest: str | None


Row = TypeVar("Row", bound=_Keyed)


def request_digest(body: BaseModel) -> str:
    """SHA-256 of ``body`` as sorted JSON, without its ``idempotency_key``."""
    document = body.model_dump(mode="json", exclude={"idempotency_key"})
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def replayed(
    session: Session, table: type[Row], *, token_id: int | None, key: str, digest: str, what: str
) -> Row | None:
    """The row ``token_id`` stored under ``key``, if any; a 409 when it was stored for
    another body."""
    token: InstrumentedAttribute[int | None] = table.token_id  # type: ignore[assignment]
    stored: InstrumentedAttribute[str | None] = table.idempotency_key  # type: ignore[assignment]
    row = session.scalars(select(table).where(token == token_id, stored == key)).one_or_none()
    if row is None:
        return None
    if row.request_digest != digest:
        raise ConflictError(
            f"idempotency key {key!r} belongs to another {what} ({what} {row.id}), sent "
            f"with a different body: use a new key for each {what}, and the same key only "
            "to retry the very same request"
        )
    return row


def insert_once(
    session: Session, row: Row, *, key: str | None, replay: Callable[[], Row | None]
) -> tuple[Row, bool]:
    """Insert ``row``; when a concurrent request with the same key won the race, the row
    it stored (``replay``) instead. Says whether ``row`` was inserted."""
    try:
        with session.begin_nested():
            session.add(row)
            session.flush()
    except IntegrityError:
        existing = replay() if key is not None else None
        if existing is None:
            raise
        return existing, False
    return row, True
