"""One row by its id, for every table: the store's one get-or-404."""

from __future__ import annotations

from typing import TypeVar

from sqlalchemy.orm import Session

from api.models import Base
from tuner.core.errors import NotFoundError

Row = TypeVar("Row", bound=Base)


def get_or_404(
    session: Session, model: type[Row], row_id: int, *, missing: str, lock: bool = False
) -> Row:
    """The row of ``model`` with ``row_id``, else :class:`NotFoundError` (HTTP 404) saying
    ``missing`` (e.g. ``"no job with id {id}; GET /api/v1/jobs lists them"``, with ``{id}``
    filled in). ``lock``: read it afresh and hold it until the transaction ends
    (``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite's write transaction already does)."""
    row = session.get(model, row_id, with_for_update=lock, populate_existing=lock)
    if row is None:
        raise NotFoundError(missing.format(id=row_id))
    return row
