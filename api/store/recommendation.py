"""The recommendation for a workload on a device, and the OOM reports that lower it.

Three indexed queries whatever the history holds: the workload and the device by key or
name, then, in one statement, the newest profile of the pair (one probe of a unique
index) with its own probes and the smallest OOM reported since. A device without a
profile of its own gets an estimate from the newest fit of the workload on another device.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import BindParameter, Select, bindparam, func, select
from sqlalchemy.orm import Session, lazyload

from api import models
from api.schemas.oom_reports import OomReportCreate, OomReportPublic
from api.schemas.recommendation import RecommendationPublic, RecommendationQuery
from api.store.generation import mark_changed
from api.store.profiles import find_device, find_workload, fit_of
from tuner import plan, results
from tuner.errors import NotFoundError


@dataclass(frozen=True)
class Measured:
    """What the recommendation needs of the newest profile of a pair, read in one query."""

    profile_id: int
    created_at: datetime
    max_micro_batch_size: int
    headroom: float
    oom_limit: int | None
    probes: list[results.ProbeResult]


def _newest_measured_statement() -> Select[Any]:
    profile, probe, oom = models.Profile, models.Probe, models.OomReport
    workload_id: BindParameter[int] = bindparam("workload_id")
    device_id: BindParameter[int] = bindparam("device_id")
    newest = (
        select(profile.id)
        .where(profile.workload_id == workload_id, profile.device_id == device_id)
        .order_by(profile.created_at.desc())
        .limit(1)
        .scalar_subquery()
    )
    smallest_oom = (
        select(func.min(oom.micro_batch_size))
        .where(
            oom.workload_id == workload_id,
            oom.device_id == device_id,
            oom.created_at > profile.created_at,
        )
        .scalar_subquery()
    )
    return (
        select(
            profile.id,
            profile.created_at,
            profile.max_micro_batch_size,
            profile.headroom,
            smallest_oom,
            probe.micro_batch_size,
            probe.fits,
            probe.peak_reserved_bytes,
            probe.non_torch_bytes,
            probe.samples_per_second,
        )
        .outerjoin(probe, probe.profile_id == profile.id)
        .where(profile.id == newest)
        .order_by(probe.ordinal)
    )


def _oom_statement(*, since: bool) -> Select[Any]:
    oom = models.OomReport
    statement = select(func.min(oom.micro_batch_size)).where(
        oom.workload_id == bindparam("workload_id"), oom.device_id == bindparam("device_id")
    )
    return statement.where(oom.created_at > bindparam("since")) if since else statement


# Built once, with bound parameters: constructing a statement costs more than SQLite
# takes to run it, and this is the path every training job's question takes.
_NEWEST_MEASURED = _newest_measured_statement()
_NEWEST_FIT = (
    select(models.Profile)
    .where(
        models.Profile.workload_id == bindparam("workload_id"),
        models.Profile.fit_bytes_per_sample > 0,
        models.Profile.fit_fixed_bytes.is_not(None),
    )
    .order_by(models.Profile.created_at.desc(), models.Profile.id.desc())
    .limit(1)
    .options(lazyload(models.Profile.probes))
)
_OOM_SINCE = _oom_statement(since=True)
_OOM_EVER = _oom_statement(since=False)


def newest_measured(session: Session, workload_id: int, device_id: int) -> Measured | None:
    """The newest profile of a pair (the one that counts), its probes and the smallest OOM
    reported after it: one statement, served by the pair's unique index."""
    rows = session.execute(
        _NEWEST_MEASURED, {"workload_id": workload_id, "device_id": device_id}
    ).all()
    if not rows:
        return None
    first = rows[0]
    return Measured(
        profile_id=first[0],
        created_at=first[1],
        max_micro_batch_size=first[2],
        headroom=first[3],
        oom_limit=first[4],
        # Only what the plan reads: size, verdict, peak and speed.
        probes=[
            results.ProbeResult(
                micro_batch_size=row[5],
                fits=row[6],
                peak_reserved_bytes=row[7],
                non_torch_bytes=row[8],
                samples_per_second=row[9],
            )
            for row in rows
            if row[5] is not None
        ],
    )


def newest_fit(session: Session, workload_id: int) -> models.Profile | None:
    """The newest profile of the workload, on any device, whose fit can estimate sizes."""
    return session.scalar(_NEWEST_FIT, {"workload_id": workload_id})


def oom_limit(
    session: Session, workload_id: int, device_id: int, since: datetime | None
) -> int | None:
    """The smallest micro batch reported to run out of memory after ``since``.

    ``since`` is the newest profile's ``created_at``, when it was measured: a profile
    measured after the report lifts it, one measured before and uploaded later does not.
    """
    parameters: dict[str, Any] = {"workload_id": workload_id, "device_id": device_id}
    if since is None:
        smallest: int | None = session.scalar(_OOM_EVER, parameters)
    else:
        smallest = session.scalar(_OOM_SINCE, {**parameters, "since": since})
    return smallest


def recommend(
    session: Session, query: RecommendationQuery, *, now: datetime
) -> RecommendationPublic:
    """Measured from the newest profile of the pair, else estimated from another device."""
    workload = find_workload(session, query.workload)
    device = find_device(session, query.device)
    measured = newest_measured(session, workload.id, device.id)
    if measured is not None:
        limit = measured.oom_limit
        chosen = plan.recommend_measured(
            max_micro_batch_size=measured.max_micro_batch_size,
            probes=measured.probes,
            capacity_bytes=device.capacity_bytes,
            global_batch_size=query.global_batch_size,
            world_size=query.world_size,
            policy=query.policy,
            oom_limit=limit,
        )
        source = Source(measured.profile_id, device.key, measured.created_at, measured.headroom)
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
        source = Source(row.id, row.device.key, row.created_at, row.headroom)
    return RecommendationPublic(
        **chosen.model_dump(),
        workload_key=workload.key,
        workload_name=workload.name,
        device_key=device.key,
        device_name=device.name,
        capacity_bytes=device.capacity_bytes,
        headroom=source.headroom,
        oom_limit=limit,
        profile_id=source.profile_id,
        profile_device_key=source.device_key,
        profile_created_at=source.created_at,
        profile_age_s=max(0.0, (now - source.created_at).total_seconds()),
    )


@dataclass(frozen=True)
class Source:
    """The profile a recommendation rests on."""

    profile_id: int
    device_key: str
    created_at: datetime
    headroom: float


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
    mark_changed(session)
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
