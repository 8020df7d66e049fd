"""What the service does for each call a client or a worker makes, once.

The REST routes (``api/routes``) and the embedded store (``api.embedded``) both
call these: each takes the request already checked against its schema, runs the store in
a session of the right kind, and returns the response schema (with whether a write created
something, which the route turns into 201 or 200). The routes add only HTTP (tokens,
statuses); the embedded store adds only the checking of plain dictionaries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread
from starlette.requests import Request

from api import models
from api.db import Database
from api.models import utcnow
from api.security import Principal
from api.store import jobs, oom_reports, profiles
from api.store.evidence import SqlEvidence
from tuner.answer import decide
from tuner.core import memory_viz
from tuner.core.errors import NotFoundError
from tuner.core.wire.jobs import JobClaim, JobCreate, JobPublic, JobQuery, JobsPublic, Lease
from tuner.core.wire.oom_reports import OomReportCreate, OomReportPublic
from tuner.core.wire.profiles import (
    PrintedProfile,
    ProfileCreate,
    ProfilePublic,
    ProfileQuery,
    ProfileReportCreate,
    ProfilesCreated,
    ProfilesPublic,
)
from tuner.core.wire.recommendation import RecommendationPublic, RecommendationQuery
from tuner.core.wire.workers import WorkerCreate, WorkerPublic

T = TypeVar("T")

# Answers computed at once by default (ServiceSettings.answer_threads), each in a worker
# thread. Python runs one thread at a time: every answer thread in flight is one more that
# the event loop (and so /healthz, and every request's reading and writing) waits behind
# for the interpreter, and each answer's time stretches to that of all in flight. The other
# questions wait their turn without using it. 4 keeps two cores busy while an answer waits
# on its database; measured under 12 connections of the heaviest question (tests/api/
# test_healthz_under_load.py) and by bench/service.py.
ANSWERS_AT_ONCE = 4


def answer_slots(count: int = ANSWERS_AT_ONCE) -> anyio.CapacityLimiter:
    """The app's limit on answers computed at once (``app.state.answer_slots``)."""
    return anyio.CapacityLimiter(count)


async def in_answer_thread(request: Request, work: Callable[..., T], *args: object) -> T:
    """``work(*args)`` in a worker thread once one of the app's answer slots is free:
    never on the event loop, and never more than ``ANSWERS_AT_ONCE`` at once."""
    slots: anyio.CapacityLimiter = request.app.state.answer_slots
    return await anyio.to_thread.run_sync(work, *args, limiter=slots)


def recommend(db: Database, query: RecommendationQuery, *, project_id: int) -> RecommendationPublic:
    """The answer to ``query``: :func:`tuner.answer.decide` over the project's evidence,
    read in one transaction."""
    with db.session() as session:
        return decide(query, SqlEvidence(session, project_id), now=utcnow())


def upload_profiles(
    db: Database, body: PrintedProfile, *, registered_by: int | None, project_id: int
) -> tuple[ProfilePublic | ProfilesCreated, bool]:
    """Store a printed profile, or every length's profile of a ``--seq-lens`` document,
    all or none; says whether any was new."""
    printed = body.profiles if not isinstance(body, ProfileReportCreate) else [body]
    with db.session(write=True) as session:
        saved = [
            profiles.save_profile(
                session, profile.create(), project_id=project_id, registered_by=registered_by
            )
            for profile in printed
        ]
        created = any(new for _, new in saved)
        stored = [profiles.to_public(row) for row, _ in saved]
    if isinstance(body, ProfileReportCreate):
        return stored[0], created
    return ProfilesCreated(data=stored, count=len(stored)), created


def upload_profile(
    db: Database, body: ProfileCreate, *, registered_by: int | None, project_id: int
) -> tuple[ProfilePublic, bool]:
    """Store one profile with its probes; says whether it was new."""
    with db.session(write=True) as session:
        row, created = profiles.save_profile(
            session, body, project_id=project_id, registered_by=registered_by
        )
        return profiles.to_public(row), created


def get_profile(db: Database, profile_id: int, *, project_id: int) -> ProfilePublic:
    with db.session() as session:
        return profiles.to_public(profiles.get_profile(session, profile_id, project_id=project_id))


def memory_snapshot(db: Database, profile_id: int, *, project_id: int) -> tuple[str, bytes]:
    """The file name and bytes of the memory timeline at the profile's M*, as PyTorch's
    memory viewer opens it (``tuner.core.memory_viz``)."""
    profile = get_profile(db, profile_id, project_id=project_id)
    found = profile.max_micro_batch_size
    probe = profile.probe_at(found) if found > 0 else None
    if probe is None or probe.timeline is None:
        raise NotFoundError(
            f"profile {profile_id} has no memory timeline: "
            + (
                "nothing fits, so no step ran at an M*"
                if probe is None
                else "it was measured before timelines were kept, or on several ranks; "
                "profile the workload again in one process to record one"
            )
        )
    name = f"profile-{profile_id}-m{found}-memory-snapshot.pickle"
    return name, memory_viz.snapshot_pickle(probe.timeline)


def list_profiles(db: Database, query: ProfileQuery, *, project_id: int) -> ProfilesPublic:
    with db.session() as session:
        rows, count, token = profiles.list_profiles(session, query, project_id=project_id)
        return ProfilesPublic(
            data=[profiles.to_summary(row) for row in rows], count=count, next_page_token=token
        )


def report_oom(
    db: Database, body: OomReportCreate, *, token_id: int | None, project_id: int
) -> tuple[OomReportPublic, bool]:
    with db.session(write=True) as session:
        return oom_reports.add_oom_report(session, body, token_id=token_id, project_id=project_id)


def queue_job(
    db: Database, body: JobCreate, *, max_attempts: int, token_id: int | None, project_id: int
) -> tuple[JobPublic, bool]:
    with db.session(write=True) as session:
        job, created = jobs.create_job(
            session, body, max_attempts=max_attempts, token_id=token_id, project_id=project_id
        )
        return JobPublic.model_validate(job), created


def sweep_expired_leases(db: Database) -> None:
    """Readers see expired leases as what they are; the write happens only when a cheap
    read finds something to sweep."""
    with db.session() as session:
        needed = jobs.has_expired_leases(session)
    if needed:
        with db.session(write=True) as session:
            jobs.expire_leases(session)


def get_job(db: Database, job_id: int, *, project_id: int) -> JobPublic:
    sweep_expired_leases(db)
    with db.session() as session:
        return JobPublic.model_validate(jobs.get_job(session, job_id, project_id=project_id))


def list_jobs(db: Database, query: JobQuery, *, project_id: int) -> JobsPublic:
    sweep_expired_leases(db)
    with db.session() as session:
        rows, count, token = jobs.list_jobs(session, query, project_id=project_id)
        return JobsPublic(
            data=[JobPublic.model_validate(row) for row in rows],
            count=count,
            next_page_token=token,
        )


def worker_public(worker: models.Worker) -> WorkerPublic:
    return WorkerPublic(
        id=worker.id,
        name=worker.name,
        device_key=worker.device.key,
        device_name=worker.device.name,
        registered_at=worker.registered_at,
        last_heartbeat_at=worker.last_heartbeat_at,
        left_at=worker.left_at,
    )


def register_worker(
    db: Database, body: WorkerCreate, caller: Principal
) -> tuple[WorkerPublic, bool]:
    with db.session(write=True) as session:
        worker, created = jobs.register_worker(session, body, caller)
        return worker_public(worker), created


def leave_worker(db: Database, worker_id: int, caller: Principal) -> WorkerPublic:
    with db.session(write=True) as session:
        return worker_public(jobs.leave_worker(session, worker_id, caller))


def claim_job(
    db: Database, worker_id: int, caller: Principal, *, lease_seconds: float, ranks: int
) -> JobClaim | None:
    """The oldest queued job for the worker's device and ranks, under a lease; ``None``
    when there is none."""
    with db.session(write=True) as session:
        claimed = jobs.claim_job(
            session, worker_id, caller, lease_seconds=lease_seconds, ranks=ranks
        )
        if claimed is None:
            return None
        job, lease = claimed
        return JobClaim(job=JobPublic.model_validate(job), lease=_lease(lease))


def extend_lease(
    db: Database, job_id: int, lease_id: str, caller: Principal, *, lease_seconds: float
) -> Lease:
    with db.session(write=True) as session:
        lease = jobs.extend_lease(session, job_id, lease_id, caller, lease_seconds=lease_seconds)
    return _lease(lease)


def complete_job(
    db: Database, job_id: int, lease_id: str, caller: Principal, profile: ProfileCreate
) -> JobPublic:
    with db.session(write=True) as session:
        return JobPublic.model_validate(
            jobs.complete_job(session, job_id, lease_id, caller, profile)
        )


def fail_job(
    db: Database,
    job_id: int,
    lease_id: str,
    caller: Principal,
    *,
    reason: str,
    retryable: bool,
) -> JobPublic:
    with db.session(write=True) as session:
        return JobPublic.model_validate(
            jobs.fail_job(session, job_id, lease_id, caller, reason=reason, retryable=retryable)
        )


def _lease(lease: jobs.Lease) -> Lease:
    return Lease(
        lease_id=lease.lease_id,
        lease_expires_at=lease.lease_expires_at,
        lease_seconds=lease.lease_seconds,
    )
