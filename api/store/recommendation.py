"""The recommendation for a workload on a device, and the OOM reports that lower it.

A handful of indexed queries whatever the history holds: the workload and the device by
key or name, the newest profile of the pair (one probe of a unique index) with its own
probes, and the smallest OOM reported since. A device without a profile of its own gets
an estimate from the newest fit of the same workload on another device.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session, lazyload

from api import models
from api.schemas.oom_reports import OomReportCreate, OomReportPublic
from api.schemas.recommendation import RecommendationPublic, RecommendationQuery
from api.store.profiles import find_device, find_workload, fit_of, to_result
from tuner import plan
from tuner.errors import NotFoundError


def newest_profile(session: Session, workload_id: int, device_id: int) -> models.Profile | None:
    """The profile that counts for a pair: the one measured last."""
    return session.scalar(
        select(models.Profile)
        .where(models.Profile.workload_id == workload_id, models.Profile.device_id == device_id)
        .order_by(models.Profile.created_at.desc())
        .limit(1)
    )


def newest_fit(session: Session, workload_id: int) -> models.Profile | None:
    """The newest profile of the workload, on any device, whose fit can estimate sizes."""
    return session.scalar(
        select(models.Profile)
        .where(
            models.Profile.workload_id == workload_id,
            models.Profile.fit_bytes_per_sample > 0,
            models.Profile.fit_fixed_bytes.is_not(None),
        )
        .order_by(models.Profile.created_at.desc(), models.Profile.id.desc())
        .limit(1)
        .options(lazyload(models.Profile.probes))
    )


def oom_limit(
    session: Session, workload_id: int, device_id: int, since: datetime | None
) -> int | None:
    """The smallest micro batch reported to run out of memory after ``since``.

    ``since`` is the newest profile's ``created_at``, when it was measured: a profile
    measured after the report lifts it, one measured before and uploaded later does not.
    """
    statement = select(func.min(models.OomReport.micro_batch_size)).where(
        models.OomReport.workload_id == workload_id, models.OomReport.device_id == device_id
    )
    if since is not None:
        statement = statement.where(models.OomReport.created_at > since)
    return session.scalar(statement)


def recommend(
    session: Session, query: RecommendationQuery, *, now: datetime
) -> RecommendationPublic:
    """Measured from the newest profile of the pair, else estimated from another device."""
    workload = find_workload(session, query.workload)
    device = find_device(session, query.device)
    row = newest_profile(session, workload.id, device.id)
    if row is not None:
        limit = oom_limit(session, workload.id, device.id, row.created_at)
        chosen = plan.recommend_measured(
            to_result(row),
            global_batch_size=query.global_batch_size,
            world_size=query.world_size,
            policy=query.policy,
            oom_limit=limit,
        )
    else:
        row = newest_fit(session, workload.id)
        fit = fit_of(row) if row is not None else None
        if row is None or fit is None:
            raise NotFoundError(
                f"workload {workload.name!r} ({workload.key}) has no profile on device "
                f"{device.name!r} ({device.key}), and none on another device to estimate "
                f"from: profile it on this device (`tuner profile {workload.target or 'TARGET'} "
                "--upload`) or queue a job for it"
            )
        # Every OOM on this device counts: no profile of its own has lifted any of them.
        limit = oom_limit(session, workload.id, device.id, None)
        chosen = plan.recommend_estimated(
            fit,
            capacity_bytes=device.capacity_bytes,
            headroom=row.headroom,
            size_cap=row.size_cap,
            global_batch_size=query.global_batch_size,
            world_size=query.world_size,
            policy=query.policy,
            oom_limit=limit,
        )
    return RecommendationPublic(
        **chosen.model_dump(),
        workload_key=workload.key,
        workload_name=workload.name,
        device_key=device.key,
        device_name=device.name,
        capacity_bytes=device.capacity_bytes,
        headroom=row.headroom,
        oom_limit=limit,
        profile_id=row.id,
        profile_device_key=row.device.key,
        profile_created_at=row.created_at,
        profile_age_s=max(0.0, (now - row.created_at).total_seconds()),
    )


def add_oom_report(session: Session, body: OomReportCreate) -> OomReportPublic:
    """Record an OOM seen in training; it holds until a newer profile of the pair exists."""
    workload = find_workload(session, body.workload)
    device = find_device(session, body.device)
    row = models.OomReport(
        workload_id=workload.id,
        device_id=device.id,
        micro_batch_size=body.micro_batch_size,
        message=body.message,
        created_at=models.utcnow(),
    )
    session.add(row)
    session.flush()
    return OomReportPublic(
        id=row.id,
        workload_id=workload.id,
        workload_key=workload.key,
        device_id=device.id,
        device_key=device.key,
        micro_batch_size=row.micro_batch_size,
        message=row.message,
        created_at=row.created_at,
    )
