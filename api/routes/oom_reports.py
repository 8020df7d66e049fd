"""Out-of-memory reports from training runs: they lower later recommendations."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from api import service
from api.deps import DatabaseDep, WriteAccess
from tuner.core.wire.oom_reports import OomReportCreate, OomReportPublic

router = APIRouter(prefix="/oom-reports", tags=["oom-reports"])


@router.post("", status_code=status.HTTP_201_CREATED)
def create_oom_report(
    body: OomReportCreate, db: DatabaseDep, caller: WriteAccess, response: Response
) -> OomReportPublic:
    """Report an OOM at a micro batch: recommendations stay below it until a newer profile
    (201; the same report again under its idempotency key answers 200)."""
    report, created = service.report_oom(
        db, body, token_id=caller.token_id, project_id=caller.project
    )
    if not created:
        response.status_code = status.HTTP_200_OK
    return report
