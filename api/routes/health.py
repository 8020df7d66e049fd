"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text

from api.deps import DatabaseDep
from tuner.core import __version__

router = APIRouter(tags=["health"])


@router.get("/healthz")
def health(db: DatabaseDep) -> dict[str, str]:
    """The service is up and its database answers."""
    with db.session() as session:
        session.execute(text("SELECT 1"))
    return {"status": "ok", "version": __version__, "database": db.dialect}
