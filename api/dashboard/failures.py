"""What went wrong in a project, newest first: out-of-memory reports from training, probes
that ran out of memory or failed, jobs that failed or were retried, and workers gone silent.

One statement pages through all of them: a ``UNION ALL`` of one small select per kind
(its kind, its row id, when, its workload and device), filtered, ordered by time and cut to
a page in the database; one count; then one statement per kind for the page's own rows.
A worker that said it leaves (``workers.left_at``) stopped on purpose: it is no failure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import ColumnElement, Integer, case, false, func, literal, null, select
from sqlalchemy.orm import Session

from api import models
from api.dashboard.queries import Choice, device_choices, query_string, workload_choices
from api.store.evidence import SqlEvidence
from api.store.projects import in_project
from tuner.answer import current

Kind = Literal[
    "oom-report", "probe-oom", "probe-error", "job-failed", "job-retried", "worker-silent"
]
KIND_LABELS: dict[Kind, str] = {
    "oom-report": "OOM in training",
    "probe-oom": "probe out of memory",
    "probe-error": "probe failed",
    "job-failed": "job failed",
    "job-retried": "job retried",
    "worker-silent": "worker silent",
}
# The page's "what" menu: groups of kinds.
Show = Literal["all", "oom", "probes", "jobs", "workers"]
SHOWS: dict[Show, str] = {
    "all": "Everything",
    "oom": "OOM reports",
    "probes": "Failed probes",
    "jobs": "Failed and retried jobs",
    "workers": "Silent workers",
}
Since = Literal["day", "week", "month", "all"]
SINCE: dict[Since, timedelta | None] = {
    "day": timedelta(days=1),
    "week": timedelta(days=7),
    "month": timedelta(days=30),
    "all": None,
}
SINCE_LABELS: dict[Since, str] = {
    "day": "Last day",
    "week": "Last week",
    "month": "Last 30 days",
    "all": "Any time",
}
PAGE_SIZE = 50


@dataclass(frozen=True)
class FailureQuery:
    """What the failures page shows: filters by id, by kind and by age, one page."""

    workload_id: int | None = None
    device_id: int | None = None
    show: Show = "all"
    since: Since = "all"
    page: int = 1

    @property
    def filtered(self) -> bool:
        return (
            self.workload_id is not None
            or self.device_id is not None
            or self.show != "all"
            or self.since != "all"
        )

    def params(self, **changes: Any) -> dict[str, str]:
        """The query string of this view with ``changes``; defaults are left out."""
        values: dict[str, Any] = {
            "workload": self.workload_id,
            "device": self.device_id,
            "show": self.show,
            "since": self.since,
            "page": self.page,
        }
        return query_string(values, changes, {"show": "all", "since": "all", "page": 1})


@dataclass(frozen=True)
class Failure:
    """One thing that went wrong, as the page and the downloads show it."""

    kind: Kind
    id: int  # the row's id in its own table (report, probe, job or worker)
    at: datetime
    subject: str  # the workload's name, the job's target or the worker's name
    device: str
    micro_batch_size: int | None
    profile_id: int | None  # the profile it concerns: a probe's, the one a report caps
    detail: str | None  # the error, the message or the reason
    attempts: str | None = None  # a job's "2/3"

    @property
    def label(self) -> str:
        return KIND_LABELS[self.kind]

    def record(self) -> dict[str, Any]:
        """The row for the downloads: plain values, the time in ISO 8601."""
        return {
            "kind": self.kind,
            "id": self.id,
            "at": self.at.isoformat(),
            "subject": self.subject,
            "device": self.device,
            "micro_batch_size": self.micro_batch_size,
            "profile_id": self.profile_id,
            "attempts": self.attempts,
            "detail": self.detail,
        }


FIELDS = (
    "kind",
    "id",
    "at",
    "subject",
    "device",
    "micro_batch_size",
    "profile_id",
    "attempts",
    "detail",
)


@dataclass(frozen=True)
class FailureList:
    rows: list[Failure]
    count: int
    workloads: list[Choice]
    devices: list[Choice]

    def pages(self, size: int) -> int:
        return max(1, -(-self.count // size))


_R = models.OomReport
_P = models.Profile
_Probe = models.Probe
_J = models.Job
_Wk = models.Worker
_W = models.Workload
_D = models.Device


def _no_id() -> Any:
    return null().cast(Integer)


def _sources(
    query: FailureQuery, *, project_id: int, now: datetime, silent_after: timedelta
) -> list[Any]:
    """One select per kind the query shows: kind, row_id, at, workload_id, device_id."""
    age = SINCE[query.since]
    since = now - age if age is not None else None
    show = query.show
    sources: list[Any] = []

    def narrowed(statement: Any, at: Any, workload: Any, device: Any) -> Any:
        where: list[ColumnElement[bool]] = []
        if since is not None:
            where.append(at >= since)
        if query.workload_id is not None:
            where.append(workload)
        if query.device_id is not None:
            where.append(device)
        return statement.where(*where)

    if show in ("all", "oom"):
        sources.append(
            narrowed(
                select(
                    literal("oom-report").label("kind"),
                    _R.id.label("row_id"),
                    _R.created_at.label("at"),
                ).where(_R.project_id == project_id),
                _R.created_at,
                _R.workload_id == query.workload_id,
                _R.device_id == query.device_id,
            )
        )
    if show in ("all", "probes"):
        kind = case((_Probe.error.is_not(None), "probe-error"), else_="probe-oom")
        sources.append(
            narrowed(
                select(kind.label("kind"), _Probe.id.label("row_id"), _P.created_at.label("at"))
                .join(_P, _P.id == _Probe.profile_id)
                .where(in_project(project_id), (_Probe.error.is_not(None)) | _Probe.oom.is_(True)),
                _P.created_at,
                _P.workload_id == query.workload_id,
                _P.device_id == query.device_id,
            )
        )
    if show in ("all", "jobs"):
        # A job names its workload by import target and its device by key or name.
        target = select(_W.target).where(_W.id == query.workload_id, _W.project_id == project_id)
        device = select(_D.key).where(_D.id == query.device_id, _D.project_id == project_id)
        device_name = select(_D.name).where(_D.id == query.device_id, _D.project_id == project_id)
        kind = case((_J.status == "failed", "job-failed"), else_="job-retried")
        sources.append(
            narrowed(
                select(kind.label("kind"), _J.id.label("row_id"), _J.updated_at.label("at")).where(
                    _J.project_id == project_id, (_J.status == "failed") | (_J.attempts > 1)
                ),
                _J.updated_at,
                _J.target == target.scalar_subquery(),
                _J.device.in_(device.union(device_name)),
            )
        )
    if show in ("all", "workers") and query.workload_id is None:
        # Silent: not heard from for two leases without saying it stops (as the jobs page).
        sources.append(
            narrowed(
                select(
                    literal("worker-silent").label("kind"),
                    _Wk.id.label("row_id"),
                    _Wk.last_heartbeat_at.label("at"),
                ).where(
                    _Wk.project_id == project_id,
                    _Wk.left_at.is_(None),
                    _Wk.last_heartbeat_at < now - silent_after,
                ),
                _Wk.last_heartbeat_at,
                false(),
                _Wk.device_id == query.device_id,
            )
        )
    return sources


def list_failures(
    session: Session,
    query: FailureQuery,
    *,
    project_id: int,
    now: datetime,
    silent_after: timedelta,
    limit: int,
    page: int | None = None,
) -> FailureList:
    """One page (``limit`` rows) of the project's failures, newest first, how many match,
    and the filter menus."""
    sources = _sources(query, project_id=project_id, now=now, silent_after=silent_after)
    workloads = workload_choices(session, project_id)
    devices = device_choices(session, project_id)
    if not sources:
        return FailureList([], 0, workloads, devices)
    union = sources[0].union_all(*sources[1:]).subquery() if len(sources) > 1 else None
    table = union if union is not None else sources[0].subquery()
    number = page if page is not None else query.page
    found = session.execute(
        select(table.c.kind, table.c.row_id)
        .order_by(table.c.at.desc(), table.c.kind, table.c.row_id.desc())
        .limit(limit)
        .offset((number - 1) * limit)
    ).all()
    count = session.scalar(select(func.count()).select_from(table)) or 0
    ids: dict[str, list[int]] = {}
    for kind, row_id in found:
        ids.setdefault(kind, []).append(row_id)
    details: dict[tuple[str, int], Failure] = {}
    for failure in [
        *_reports(session, ids.get("oom-report", []), project_id),
        *_probes(session, ids.get("probe-oom", []) + ids.get("probe-error", [])),
        *_jobs(session, ids.get("job-failed", []) + ids.get("job-retried", [])),
        *_workers(session, ids.get("worker-silent", [])),
    ]:
        details[(failure.kind, failure.id)] = failure
    rows = [details[(kind, row_id)] for kind, row_id in found]
    return FailureList(rows, count, workloads, devices)


def _reports(session: Session, ids: Sequence[int], project_id: int) -> list[Failure]:
    """The reports, each with the profile it caps (:func:`tuner.answer.current.
    capped_profile`)."""
    if not ids:
        return []
    rows = session.execute(
        select(_R.id, _R.created_at, _W.name, _D.name, _R.micro_batch_size, _R.message, _W.id)
        .join(_W, _W.id == _R.workload_id)
        .join(_D, _D.id == _R.device_id)
        .where(_R.id.in_(ids))
    ).all()
    evidence = SqlEvidence(session, project_id)
    workload_ids = {row[6] for row in rows}
    profiles = evidence.profiles(workload_ids)
    reports = {report.id: report for report in evidence.oom_reports(workload_ids)}
    failures = []
    for row in rows:
        capped = current.capped_profile(reports[row[0]], profiles)
        failures.append(
            Failure(
                kind="oom-report",
                id=row[0],
                at=row[1],
                subject=row[2],
                device=row[3],
                micro_batch_size=row[4],
                profile_id=capped.id if capped is not None else None,
                detail=row[5],
            )
        )
    return failures


def _probes(session: Session, ids: Sequence[int]) -> list[Failure]:
    if not ids:
        return []
    rows = session.execute(
        select(
            _Probe.id, _P.created_at, _W.name, _D.name, _Probe.micro_batch_size, _P.id, _Probe.error
        )
        .join(_P, _P.id == _Probe.profile_id)
        .join(_W, _W.id == _P.workload_id)
        .join(_D, _D.id == _P.device_id)
        .where(_Probe.id.in_(ids))
    ).all()
    return [
        Failure(
            kind="probe-error" if row[6] is not None else "probe-oom",
            id=row[0],
            at=row[1],
            subject=row[2],
            device=row[3],
            micro_batch_size=row[4],
            profile_id=row[5],
            detail=row[6] if row[6] is not None else "ran out of memory: does not fit",
        )
        for row in rows
    ]


def _jobs(session: Session, ids: Sequence[int]) -> list[Failure]:
    if not ids:
        return []
    jobs = session.scalars(select(_J).where(_J.id.in_(ids))).all()
    return [
        Failure(
            kind="job-failed" if job.status == "failed" else "job-retried",
            id=job.id,
            at=job.updated_at,
            subject=job.target,
            device=job.device,
            micro_batch_size=None,
            profile_id=job.profile_id,
            detail=job.error,
            attempts=f"{job.attempts}/{job.max_attempts}",
        )
        for job in jobs
    ]


def _workers(session: Session, ids: Sequence[int]) -> list[Failure]:
    if not ids:
        return []
    workers = session.scalars(select(_Wk).where(_Wk.id.in_(ids))).all()
    return [
        Failure(
            kind="worker-silent",
            id=worker.id,
            at=worker.last_heartbeat_at,
            subject=worker.name,
            device=worker.device.name,
            micro_batch_size=None,
            profile_id=None,
            detail="not heard from since its last heartbeat, and it did not say it stops",
        )
        for worker in workers
    ]
