"""Jobs and workers: queueing, atomic claims under a lease, heartbeats, and finishing a job
exactly once.

A claim picks the oldest queued job for the worker's device with ``FOR UPDATE SKIP
LOCKED`` on PostgreSQL, so concurrent claimers skip each other's rows instead of waiting
or taking the same one. SQLite has no row locks; there every write session starts with
``BEGIN IMMEDIATE``, which serializes writers, so the same select-then-update is atomic.

A lease is the worker's right to a job until ``lease_expires_at``. Heartbeats extend it;
a result or failure is accepted only under the current, unexpired lease of a running job,
inside a transaction that holds the job's row. Expired leases are swept when workers
claim (and when jobs are read): the job goes back to the queue, or fails once it has had
``max_attempts`` claims. ``attempts`` counts claims.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from api import models
from api.security import Principal
from api.store.idempotency import insert_once, replayed, request_digest
from api.store.paging import keyset_page
from api.store.profiles import add_profile, upsert_device
from api.store.rows import get_or_404
from tuner.answer.identity import owned
from tuner.core import results
from tuner.core.errors import BadInputError, ConflictError, PermissionDeniedError
from tuner.core.wire.common import API_PREFIX
from tuner.core.wire.jobs import JobCreate, JobQuery
from tuner.core.wire.workers import WorkerCreate


@dataclass(frozen=True)
class Lease:
    lease_id: str
    lease_expires_at: datetime
    lease_seconds: float


def _when(moment: datetime | None) -> str:
    return "(never)" if moment is None else moment.isoformat(timespec="seconds")


# Workers


def register_worker(
    session: Session, body: WorkerCreate, caller: Principal
) -> tuple[models.Worker, bool]:
    """A new worker of the caller's project on the device ``body`` describes (the project's
    device, created if new), bound to the token that registers it; says whether it is
    new. A registration this token sent before under the same idempotency key is that
    worker (:mod:`api.store.idempotency`)."""
    key, digest = body.idempotency_key, request_digest(body)

    def replay() -> models.Worker | None:
        if key is None:
            return None
        return replayed(
            session, models.Worker, token_id=caller.token_id, key=key, digest=digest, what="worker"
        )

    existing = replay()
    if existing is not None:
        return existing, False
    device = upsert_device(
        session,
        body.device_key,
        body.device,
        project_id=caller.project,
        registered_by=caller.token_id,
    )
    worker = models.Worker(
        project_id=caller.project,
        name=body.name,
        device=device,
        token_id=caller.token_id,
        idempotency_key=key,
        request_digest=digest if key is not None else None,
    )
    return insert_once(session, worker, key=key, replay=replay)


def get_worker(session: Session, worker_id: int, *, project_id: int) -> models.Worker:
    return get_or_404(
        session,
        models.Worker,
        worker_id,
        missing=f"no worker with id {{id}}: register again with POST {API_PREFIX}/workers",
        project_id=project_id,
    )


def list_workers(session: Session, *, project_id: int) -> list[models.Worker]:
    of_project = select(models.Worker).where(models.Worker.project_id == project_id)
    return list(session.scalars(of_project.order_by(models.Worker.id)))


def touch_worker(session: Session, worker_id: int, caller: Principal) -> models.Worker:
    worker = get_worker(session, worker_id, project_id=caller.project)
    check_acts_for(worker, caller)
    worker.last_heartbeat_at = models.utcnow()
    worker.left_at = None  # heard from again: running
    return worker


def leave_worker(session: Session, worker_id: int, caller: Principal) -> models.Worker:
    """The worker says it stops on purpose: gone, not silent. It holds no job then (it
    hands a running one back before it leaves; a lease it left behind expires as usual)."""
    worker = get_worker(session, worker_id, project_id=caller.project)
    check_acts_for(worker, caller)
    worker.left_at = models.utcnow()
    return worker


def check_acts_for(worker: models.Worker, caller: Principal) -> None:
    """Only the token that registered ``worker`` (or an admin's) may act for it."""
    if worker.token_id is None or caller.allows("admin") or worker.token_id == caller.token_id:
        return
    raise PermissionDeniedError(
        f"worker {worker.id} ({worker.name!r}) was registered with another token: a token "
        f"acts only for the workers it registered; register this one with POST {API_PREFIX}/workers"
    )


# Jobs


def create_job(
    session: Session,
    body: JobCreate,
    *,
    max_attempts: int,
    token_id: int | None,
    project_id: int,
) -> tuple[models.Job, bool]:
    """Queue the job ``body`` asks for in the project; says whether it is new. Only the
    project's workers take it, and what it measures is stored in the project, registered
    in the name of the token that queued it (:mod:`tuner.answer.identity`), not the
    worker's. A job this token queued
    before under the same idempotency key is that job (:mod:`api.store.idempotency`)."""
    key, digest = body.idempotency_key, request_digest(body)

    def replay() -> models.Job | None:
        if key is None:
            return None
        return replayed(session, models.Job, token_id=token_id, key=key, digest=digest, what="job")

    existing = replay()
    if existing is not None:
        return existing, False
    now = models.utcnow()
    job = models.Job(
        project_id=project_id,
        target=body.target,
        options=dict(body.options),
        settings=body.settings.model_dump(mode="json"),
        device=body.device,
        status="queued",
        attempts=0,
        max_attempts=max_attempts,
        token_id=token_id,
        idempotency_key=key,
        request_digest=digest if key is not None else None,
        created_at=now,
        updated_at=now,
    )
    return insert_once(session, job, key=key, replay=replay)


_NO_JOB = f"no job with id {{id}}; GET {API_PREFIX}/jobs lists them"


def get_job(session: Session, job_id: int, *, project_id: int) -> models.Job:
    return get_or_404(session, models.Job, job_id, missing=_NO_JOB, project_id=project_id)


def list_jobs(
    session: Session, query: JobQuery, *, project_id: int
) -> tuple[list[models.Job], int, str | None]:
    """Newest first: one page of the project's jobs, the count of all that match, and the
    next token."""
    where = [models.Job.project_id == project_id]
    if query.status is not None:
        where.append(models.Job.status == query.status)
    if query.device is not None:
        where.append(models.Job.device == query.device)
    return keyset_page(
        session,
        models.Job,
        created_at=models.Job.created_at,
        row_id=models.Job.id,
        where=where,
        query=query,
    )


def has_expired_leases(session: Session) -> bool:
    """Whether a sweep would change anything: a cheap read that spares readers a write."""
    expired = select(models.Job.id).where(
        models.Job.status == "running", models.Job.lease_expires_at < models.utcnow()
    )
    return session.scalar(expired.limit(1)) is not None


def expire_leases(session: Session) -> int:
    """Requeue every running job whose lease expired, or fail it after its last attempt.

    Rows another transaction holds (a heartbeat, a result, another sweep) are skipped:
    that transaction decides their fate, and the next sweep sees what it left.
    """
    now = models.utcnow()
    expired = session.scalars(
        select(models.Job)
        .where(models.Job.status == "running", models.Job.lease_expires_at < now)
        .with_for_update(skip_locked=True)
    ).all()
    for job in expired:
        what = (
            f"attempt {job.attempts} of {job.max_attempts}: the lease of worker "
            f"{job.worker_id} expired at {_when(job.lease_expires_at)} without a heartbeat "
            "(the worker stopped, lost its connection to the service, or hung)"
        )
        if job.attempts >= job.max_attempts:
            _finish(job, "failed", now, error=f"{what}; no attempts left, so the job failed")
        else:
            _requeue(job, now, error=f"{what}; queued again")
    return len(expired)


# Queued jobs a claim looks through for one its worker has the ranks for.
_CLAIM_WINDOW = 50


def claim_job(
    session: Session, worker_id: int, caller: Principal, *, lease_seconds: float, ranks: int = 1
) -> tuple[models.Job, Lease] | None:
    """Give the oldest queued job for the worker's device (its key or its name) that needs
    at most ``ranks`` ranks (the worker's devices, or processes on a CPU) to the worker
    under a new lease, or return None when there is none.

    A job that needs more ranks stays queued for a worker that has them, and says so in
    its ``error`` until one claims it."""
    worker = touch_worker(session, worker_id, caller)
    expire_leases(session)
    # A job names its device by key or by name. A name means what a question by that name
    # means (tuner.answer.identity): the name's owner's devices. A device another token
    # registered later under the same name is not one of them, and its worker may not
    # take jobs meant for the owner's devices.
    addresses = [worker.device.key]
    if _name_means(session, worker.device):
        addresses.append(worker.device.name)
    candidates = session.scalars(
        select(models.Job)
        .where(
            models.Job.project_id == worker.project_id,
            models.Job.status == "queued",
            models.Job.device.in_(addresses),
        )
        .order_by(models.Job.created_at, models.Job.id)
        .limit(_CLAIM_WINDOW)
        .with_for_update(skip_locked=True)
    ).all()
    job = None
    for candidate in candidates:
        needed = job_ranks(candidate)
        if needed <= ranks:
            job = candidate
            break
        waiting = (
            f"waiting for a worker with {needed} ranks: worker {worker.name!r} has {ranks} "
            f"(devices, or processes on a CPU); start one with `tuner worker --ranks {needed}`"
        )
        if candidate.error != waiting:
            candidate.error = waiting
            candidate.updated_at = models.utcnow()
    if job is None:
        return None
    now = models.utcnow()
    lease = Lease(uuid.uuid4().hex, now + timedelta(seconds=lease_seconds), lease_seconds)
    job.status = "running"
    job.attempts += 1
    job.worker_id = worker.id
    job.lease_id = lease.lease_id
    job.lease_expires_at = lease.lease_expires_at
    job.updated_at = now
    session.flush()
    return job, lease


def _name_means(session: Session, device: models.Device) -> bool:
    """Whether ``device``'s name resolves to it: it is among its name owner's devices."""
    named = session.execute(
        select(
            models.Device.id, models.Device.key, models.Device.name, models.Device.registered_by
        ).where(models.Device.project_id == device.project_id, models.Device.name == device.name)
    ).all()
    return any(row.id == device.id for row in owned(named, device.name))


def job_ranks(job: models.Job) -> int:
    """The ranks a job profiles on: its world size when it runs DDP or FSDP, else one."""
    world_size = job.settings.get("world_size") or 1
    return int(world_size) if job.settings.get("parallel") != "none" else 1


def _held(session: Session, job_id: int, lease_id: str, caller: Principal) -> models.Job:
    """The job, its row locked, if ``lease_id`` is its current and unexpired lease and
    ``caller`` acts for the worker that holds it."""
    job = get_or_404(
        session, models.Job, job_id, missing=_NO_JOB, lock=True, project_id=caller.project
    )
    holder = session.get(models.Worker, job.worker_id) if job.worker_id is not None else None
    if holder is not None:
        check_acts_for(holder, caller)
    if job.status in ("succeeded", "failed"):
        raise ConflictError(
            f"job {job_id} already {job.status}; its outcome is recorded once, so this "
            "request was not applied: drop it and claim the next job"
        )
    if job.status != "running" or job.lease_id != lease_id:
        raise ConflictError(
            f"lease {lease_id[:8]}... is no longer the lease of job {job_id} (it expired "
            "and the job went back to the queue or to another worker): stop working on "
            "it and claim the next job"
        )
    if job.lease_expires_at is None or job.lease_expires_at <= models.utcnow():
        raise ConflictError(
            f"the lease of job {job_id} expired at {_when(job.lease_expires_at)}: it will "
            "be retried; heartbeat more often than the lease length to keep a job"
        )
    return job


def extend_lease(
    session: Session, job_id: int, lease_id: str, caller: Principal, *, lease_seconds: float
) -> Lease:
    job = _held(session, job_id, lease_id, caller)
    now = models.utcnow()
    job.lease_expires_at = now + timedelta(seconds=lease_seconds)
    job.updated_at = now
    if job.worker_id is not None:
        touch_worker(session, job.worker_id, caller)
    return Lease(lease_id, job.lease_expires_at, lease_seconds)


def complete_job(
    session: Session, job_id: int, lease_id: str, caller: Principal, profile: results.Profile
) -> models.Job:
    """Store the profile and mark the job succeeded, in the caller's one transaction."""
    job = _held(session, job_id, lease_id, caller)
    # Always checked: a profile that names no target could be of any workload, stored in
    # the name of whoever queued the job.
    if profile.workload.target != job.target:
        raise BadInputError(
            f"the profile is of {profile.workload.target or 'no target'}, but job {job_id} "
            f"profiles {job.target}: send the profile this job produced"
        )
    # Registered by whoever queued the job (jobs queued before 0011: the worker's token).
    registrant = job.token_id if job.token_id is not None else caller.token_id
    row = add_profile(session, profile, project_id=job.project_id, registered_by=registrant)
    _finish(job, "succeeded", models.utcnow(), error=None)
    job.profile_id = row.id
    session.flush()
    return job


def fail_job(
    session: Session,
    job_id: int,
    lease_id: str,
    caller: Principal,
    *,
    reason: str,
    retryable: bool,
) -> models.Job:
    """Record a failed attempt: queued again when retryable and attempts remain, else failed."""
    job = _held(session, job_id, lease_id, caller)
    now = models.utcnow()
    attempt = f"attempt {job.attempts} of {job.max_attempts}"
    if retryable and job.attempts < job.max_attempts:
        _requeue(job, now, error=f"{attempt}: {reason}")
    elif retryable:
        _finish(job, "failed", now, error=f"{attempt}, the last: {reason}")
    else:
        _finish(job, "failed", now, error=f"{attempt} (not retried): {reason}")
    session.flush()
    return job


def _requeue(job: models.Job, now: datetime, *, error: str) -> None:
    job.status = "queued"
    job.lease_id = None
    job.lease_expires_at = None
    job.worker_id = None
    job.error = error
    job.updated_at = now


def _finish(job: models.Job, status: str, now: datetime, *, error: str | None) -> None:
    # worker_id stays: it says who finished (or last held) the job.
    job.status = status
    job.lease_id = None
    job.lease_expires_at = None
    job.error = error
    job.updated_at = now
