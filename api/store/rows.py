"""One row by its id, for every table: the store's one get-or-404."""

from __future__ import annotations

from typing import TypeVar

from sqlalchemy.orm import Session

from api.models import Base
from tuner.core.errors import NotFoundError

Row = TypeVar("Row", bound=Base)


def get_or_404(
    session: Session,
    model: type[Row],
    row_id: int,
    *,
    missing: str,
    lock: bool = False,
    project_id: int | None = None,
) -> Row:
    """The row of ``model`` with ``row_id``, else :class:`NotFoundError` (HTTP 404) saying
    ``missing`` (e.g. ``"no job with id {id}; GET /api/v1/jobs lists them"``, with ``{id}``
    filled in). ``lock``: read it afresh and hold it until the transaction ends
    (``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite's write transaction already does).
    ``project_id``: a row of another project is missing too, in the same words, so that
    nobody learns which ids other projects hold."""
    row = session.get(model, row_id, with_for_update=lock, populate_existing=lock)
    if row is None or (project_id is not None and getattr(row, "project_id", None) != project_id):
        raise NotFoundError(missing.format(id=row_id))
    return row
