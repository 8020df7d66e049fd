"""The recommendation for a workload on a device, and the OOM reports that lower it.

Three indexed reads whatever the history holds: the workload and the device by key or
name, then, in one statement, the newest profile of the pair (one probe of a unique
index) with its own probes and the smallest OOM reported since. A device without a
profile of its own gets an estimate from the newest fit of the workload on another device.

Every training job asks this question at start-up, so the reads are prepared statements
run on the driver's connection (see ``api.store.prepared``): a fresh answer costs about
a tenth of what the same reads cost through ORM sessions.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import BindParameter, Dialect, Select, bindparam, func, select
from sqlalchemy.orm import Session, lazyload

from api import models
from api.schemas.oom_reports import OomReportCreate, OomReportPublic
from api.schemas.recommendation import RecommendationPublic, RecommendationQuery
from api.store.generation import mark_changed
from api.store.prepared import PreparedSelect
from api.store.profiles import (
    DEVICE_MISSING,
    WORKLOAD_MISSING,
    by_key_or_name,
    choose_by_reference,
    find_device,
    find_workload,
)
from tuner.core import plan, results
from tuner.core.errors import NotFoundError

_P, _D, _W = models.Profile, models.Device, models.Workload


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


def _newest_fit_statement(*columns: Any) -> Select[Any]:
    """The newest profile of the workload, on any device, whose fit can estimate sizes."""
    return (
        select(*columns)
        .where(
            _P.workload_id == bindparam("workload_id"),
            _P.fit_bytes_per_sample > 0,
            _P.fit_fixed_bytes.is_not(None),
        )
        .order_by(_P.created_at.desc(), _P.id.desc())
        .limit(1)
    )


# Built once, with bound parameters: constructing a statement costs more than SQLite
# takes to run it.
_NEWEST_FIT = _newest_fit_statement(_P).options(lazyload(_P.probes))


def newest_fit(session: Session, workload_id: int) -> models.Profile | None:
    """The newest profile of the workload, on any device, whose fit can estimate sizes."""
    row: models.Profile | None = session.scalar(_NEWEST_FIT, {"workload_id": workload_id})
    return row


class _Workload(NamedTuple):
    id: int
    key: str
    name: str
    target: str | None


class _Device(NamedTuple):
    id: int
    key: str
    name: str
    capacity_bytes: int


class _Reads:
    """The recommendation's statements, prepared for one dialect."""

    def __init__(self, dialect: Dialect) -> None:
        oom = models.OomReport
        self.workload = PreparedSelect(
            by_key_or_name(_W.key, _W.name, _W.id, _W.key, _W.name, _W.target), dialect
        )
        self.device = PreparedSelect(
            by_key_or_name(_D.key, _D.name, _D.id, _D.key, _D.name, _D.capacity_bytes), dialect
        )
        self.newest_measured = PreparedSelect(_newest_measured_statement(), dialect)
        self.newest_fit = PreparedSelect(
            _newest_fit_statement(
                _P.id,
                _D.key,
                _P.created_at,
                _P.headroom,
                _P.size_cap,
                _P.fit_fixed_bytes,
                _P.fit_bytes_per_sample,
                _P.fit_points,
            ).join(_D, _D.id == _P.device_id),
            dialect,
        )
        # No profile of its own has lifted any OOM reported on this device.
        self.oom_ever = PreparedSelect(
            select(func.min(oom.micro_batch_size)).where(
                oom.workload_id == bindparam("workload_id"),
                oom.device_id == bindparam("device_id"),
            ),
            dialect,
        )


_prepared: dict[str, _Reads] = {}
_prepared_lock = threading.Lock()


def _reads(dialect: Dialect) -> _Reads:
    reads = _prepared.get(dialect.name)
    if reads is None:
        with _prepared_lock:
            reads = _prepared.setdefault(dialect.name, _Reads(dialect))
    return reads


@dataclass(frozen=True)
class Source:
    """The profile a recommendation rests on."""

    profile_id: int
    device_key: str
    created_at: datetime
    headroom: float


def recommend(
    session: Session, query: RecommendationQuery, *, now: datetime
) -> RecommendationPublic:
    """Measured from the newest profile of the pair, else estimated from another device,
    read in the session's transaction."""
    connection = session.connection()
    return recommend_on(connection.connection.driver_connection, connection.dialect, query, now=now)


def recommend_on(
    connection: Any, dialect: Dialect, query: RecommendationQuery, *, now: datetime
) -> RecommendationPublic:
    """:func:`recommend` on a DBAPI connection of ``dialect``, in its current transaction."""
    reads = _reads(dialect)
    workload = choose_by_reference(
        [_Workload(*row) for row in reads.workload.rows(connection, ref=query.workload)],
        query.workload,
        what="workload",
        missing=WORKLOAD_MISSING,
    )
    device = choose_by_reference(
        [_Device(*row) for row in reads.device.rows(connection, ref=query.device)],
        query.device,
        what="device",
        missing=DEVICE_MISSING,
    )
    pair = {"workload_id": workload.id, "device_id": device.id}
    measured = reads.newest_measured.rows(connection, **pair)
    if measured:
        profile_id, created_at, max_micro_batch_size, headroom, limit = measured[0][:5]
        # Only what the plan reads of each probe: size, verdict, peak and speed.
        probes = [
            results.ProbeResult(
                micro_batch_size=row[5],
                fits=row[6],
                peak_reserved_bytes=row[7],
                non_torch_bytes=row[8],
                samples_per_second=row[9],
            )
            for row in measured
            if row[5] is not None
        ]
        chosen = plan.recommend_measured(
            max_micro_batch_size=max_micro_batch_size,
            probes=probes,
            capacity_bytes=device.capacity_bytes,
            global_batch_size=query.global_batch_size,
            world_size=query.world_size,
            policy=query.policy,
            oom_limit=limit,
        )
        source = Source(profile_id, device.key, created_at, headroom)
    else:
        fitted = reads.newest_fit.rows(connection, workload_id=workload.id)
        if not fitted:
            raise NotFoundError(
                f"workload {workload.name!r} ({workload.key}) has no profile on device "
                f"{device.name!r} ({device.key}), and none on another device to estimate "
                f"from: profile it on this device (`tuner profile {workload.target or 'TARGET'} "
                "--upload`) or queue a job for it"
            )
        profile_id, device_key, created_at, headroom, size_cap, fixed, per_sample, points = fitted[
            0
        ]
        limit = reads.oom_ever.rows(connection, **pair)[0][0]
        chosen = plan.recommend_estimated(
            results.AffineFit(fixed_bytes=fixed, bytes_per_sample=per_sample, points=points or 0),
            capacity_bytes=device.capacity_bytes,
            headroom=headroom,
            size_cap=size_cap,
            global_batch_size=query.global_batch_size,
            world_size=query.world_size,
            policy=query.policy,
            oom_limit=limit,
        )
        source = Source(profile_id, device_key, created_at, headroom)
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
