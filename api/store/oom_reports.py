"""Out-of-memory reports: stored once per event, and the limit they put on answers.

A report names the micro batch that ran out of memory and, when the run went on, the
smaller size it settled on. Answers for the pair stay below the failed size, and at or
below the settled size when there is one: no run has shown anything between the two to
fit, and the profile that said the failed size fits was wrong about that neighbourhood.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func
from sqlalchemy.orm import Session

from api import models
from api.store.generation import mark_changed
from api.store.idempotency import insert_once, replayed, request_digest
from api.store.profiles import find_device, find_workload, get_profile
from tuner.core.errors import BadInputError
from tuner.core.wire.oom_reports import OomReportCreate, OomReportPublic


def smallest_limit(oom: type[models.OomReport]) -> Any:
    """SQL for the failed size answers must stay below: ``min(settled + 1, failed)``."""
    return func.min(func.coalesce(oom.settled_micro_batch_size + 1, oom.micro_batch_size))


def add_oom_report(
    session: Session, body: OomReportCreate, *, token_id: int | None, project_id: int
) -> tuple[OomReportPublic, bool]:
    """Record an OOM seen in training; it holds until a newer profile of the pair exists.
    Says whether the report is new.

    A report whose idempotency key this token used before is that report (a retry, or
    the same event from another rank): it is returned, not added again; the same key with
    a report that differs in anything, its message included, is refused
    (:mod:`api.store.idempotency`).
    """
    workload, device = _attached_to(session, body, project_id)
    key, digest = body.idempotency_key, request_digest(body)

    def replay() -> models.OomReport | None:
        if key is None:
            return None
        return replayed(
            session, models.OomReport, token_id=token_id, key=key, digest=digest, what="report"
        )

    existing = replay()
    if existing is not None:
        return _public(existing, workload, device), False
    row = models.OomReport(
        project_id=project_id,
        workload_id=workload.id,
        device_id=device.id,
        micro_batch_size=body.micro_batch_size,
        settled_micro_batch_size=body.settled_micro_batch_size,
        profile_id=body.profile_id,
        token_id=token_id,
        idempotency_key=key,
        request_digest=digest if key is not None else None,
        message=body.message,
        created_at=models.utcnow(),
    )
    row, created = insert_once(session, row, key=key, replay=replay)
    if created:
        mark_changed(session)
    return _public(row, workload, device), created


def _attached_to(
    session: Session, body: OomReportCreate, project_id: int
) -> tuple[models.Workload, models.Device]:
    """The project's workload and device the report caps. With the profile its plan came
    from, that profile's workload (the row the plan was read from, not whatever the name
    means now), which ``workload`` must name; the device is the one named (an answer
    estimated from another device's profile ran out of memory on this one)."""
    device = find_device(session, body.device, project_id=project_id)
    if body.profile_id is None:
        return find_workload(session, body.workload, project_id=project_id), device
    workload = get_profile(session, body.profile_id, project_id=project_id).workload
    if body.workload not in (workload.key, workload.name):
        raise BadInputError(
            f"profile {body.profile_id} is of workload {workload.name!r} ({workload.key}), "
            f"not {body.workload!r}: report with the recommendation that ran out of memory"
        )
    return workload, device


def _public(row: models.OomReport, workload: Any, device: Any) -> OomReportPublic:
    return OomReportPublic(
        id=row.id,
        workload_id=workload.id,
        workload_key=workload.key,
        device_id=device.id,
        device_key=device.key,
        micro_batch_size=row.micro_batch_size,
        settled_micro_batch_size=row.settled_micro_batch_size,
        profile_id=row.profile_id,
        idempotency_key=row.idempotency_key,
        message=row.message,
        created_at=row.created_at,
    )
