"""Out-of-memory reports: stored once per event, and the limit they put on answers.

A report names the micro batch that ran out of memory and, when the run went on, the
smaller size it settled on. Answers for the pair stay below the failed size, and at or
below the settled size when there is one: no run has shown anything between the two to
fit, and the profile that said the failed size fits was wrong about that neighbourhood.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api import models
from api.schemas.oom_reports import OomReportCreate, OomReportPublic
from api.store.generation import mark_changed
from api.store.profiles import find_device, find_workload
from tuner.core.errors import ConflictError


def smallest_limit(oom: type[models.OomReport]) -> Any:
    """SQL for the failed size answers must stay below: ``min(settled + 1, failed)``."""
    return func.min(func.coalesce(oom.settled_micro_batch_size + 1, oom.micro_batch_size))


def add_oom_report(session: Session, body: OomReportCreate) -> OomReportPublic:
    """Record an OOM seen in training; it holds until a newer profile of the pair exists.

    A report whose idempotency key is stored already is that report (a retry, or the same
    event from another rank): it is returned, not added again. The same key with another
    report is refused.
    """
    workload = find_workload(session, body.workload)
    device = find_device(session, body.device)
    if body.idempotency_key is not None:
        existing = _by_key(session, body.idempotency_key)
        if existing is not None:
            return _same_event(existing, body, workload, device)
    row = models.OomReport(
        workload_id=workload.id,
        device_id=device.id,
        micro_batch_size=body.micro_batch_size,
        settled_micro_batch_size=body.settled_micro_batch_size,
        idempotency_key=body.idempotency_key,
        message=body.message,
        created_at=models.utcnow(),
    )
    try:
        with session.begin_nested():  # a concurrent copy of the event may win the key
            session.add(row)
            session.flush()
    except IntegrityError:
        existing = _by_key(session, body.idempotency_key or "")
        if existing is None:
            raise
        return _same_event(existing, body, workload, device)
    mark_changed(session)
    return _public(row, workload, device)


def _by_key(session: Session, key: str) -> models.OomReport | None:
    oom = models.OomReport
    return session.scalars(select(oom).where(oom.idempotency_key == key)).one_or_none()


def _same_event(
    existing: models.OomReport, body: OomReportCreate, workload: Any, device: Any
) -> OomReportPublic:
    stored = (
        existing.workload_id,
        existing.device_id,
        existing.micro_batch_size,
        existing.settled_micro_batch_size,
    )
    asked = (workload.id, device.id, body.micro_batch_size, body.settled_micro_batch_size)
    if stored != asked:
        raise ConflictError(
            f"idempotency key {body.idempotency_key!r} belongs to another report (report "
            f"{existing.id}): use a new key for each out-of-memory event"
        )
    return _public(existing, workload, device)


def _public(row: models.OomReport, workload: Any, device: Any) -> OomReportPublic:
    return OomReportPublic(
        id=row.id,
        workload_id=workload.id,
        workload_key=workload.key,
        device_id=device.id,
        device_key=device.key,
        micro_batch_size=row.micro_batch_size,
        settled_micro_batch_size=row.settled_micro_batch_size,
        idempotency_key=row.idempotency_key,
        message=row.message,
        created_at=row.created_at,
    )
