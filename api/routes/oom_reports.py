"""Out-of-memory reports from training runs: they lower later recommendations."""

from __future__ import annotations

from fastapi import APIRouter, status

from api.deps import DatabaseDep, WriteAccess
from api.schemas.oom_reports import OomReportCreate, OomReportPublic
from api.store import oom_reports as store

router = APIRouter(prefix="/oom-reports", tags=["oom-reports"])


@router.post("", status_code=status.HTTP_201_CREATED)
def create_oom_report(body: OomReportCreate, db: DatabaseDep, _: WriteAccess) -> OomReportPublic:
    """Report an OOM at a micro batch: recommendations stay below it until a newer profile."""
    with db.session(write=True) as session:
        return store.add_oom_report(session, body)
