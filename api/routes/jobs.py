"""Profiling jobs: queue them, watch them, and (as a worker) heartbeat and finish them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response, status

from api.deps import DatabaseDep, ReadAccess, SettingsDep, WorkerAccess, WriteAccess
from api.schemas.common import INT32_MAX
from api.schemas.jobs import (
    JobCreate,
    JobFailure,
    JobPublic,
    JobQuery,
    JobResult,
    JobsPublic,
    Lease,
    LeaseRef,
)
from api.store import jobs as store

router = APIRouter(prefix="/jobs", tags=["jobs"])

JobId = Annotated[int, Path(ge=1, le=INT32_MAX, description="the job's id")]


def _sweep_if_needed(db: DatabaseDep) -> None:
    # Readers should see expired leases as what they are; the write happens only when a
    # cheap read finds something to sweep.
    with db.session() as session:
        needed = store.has_expired_leases(session)
    if needed:
        with db.session(write=True) as session:
            store.expire_leases(session)


@router.post("", status_code=201)
def create_job(
    body: JobCreate, db: DatabaseDep, settings: SettingsDep, caller: WriteAccess, response: Response
) -> JobPublic:
    """Queue a profiling job for a device (its key or its name): 201; the same request
    again under its idempotency key answers 200 with the job it queued."""
    with db.session(write=True) as session:
        job, created = store.create_job(
            session, body, max_attempts=settings.max_attempts, token_id=caller.token_id
        )
        if not created:
            response.status_code = status.HTTP_200_OK
        return JobPublic.model_validate(job)


@router.get("")
def list_jobs(db: DatabaseDep, _: ReadAccess, query: Annotated[JobQuery, Query()]) -> JobsPublic:
    """List jobs, newest first, optionally by status and device."""
    _sweep_if_needed(db)
    with db.session() as session:
        rows, count, token = store.list_jobs(session, query)
        return JobsPublic(
            data=[JobPublic.model_validate(row) for row in rows],
            count=count,
            next_page_token=token,
        )


@router.get("/{job_id}")
def get_job(job_id: JobId, db: DatabaseDep, _: ReadAccess) -> JobPublic:
    """One job, with its status, attempts and error."""
    _sweep_if_needed(db)
    with db.session() as session:
        return JobPublic.model_validate(store.get_job(session, job_id))


@router.post("/{job_id}/heartbeat")
def heartbeat(
    job_id: JobId, body: LeaseRef, db: DatabaseDep, settings: SettingsDep, caller: WorkerAccess
) -> Lease:
    """Extend the lease on a running job; 409 when the lease is no longer current, 403 for
    a token that did not register the worker holding it."""
    with db.session(write=True) as session:
        lease = store.extend_lease(
            session, job_id, body.lease_id, caller, lease_seconds=settings.lease_seconds
        )
    return Lease(
        lease_id=lease.lease_id,
        lease_expires_at=lease.lease_expires_at,
        lease_seconds=lease.lease_seconds,
    )


@router.post("/{job_id}/result")
def submit_result(
    job_id: JobId, body: JobResult, db: DatabaseDep, caller: WorkerAccess
) -> JobPublic:
    """Store the job's profile and mark it succeeded; 409 under a stale lease."""
    with db.session(write=True) as session:
        job = store.complete_job(session, job_id, body.lease_id, caller, body.profile)
        return JobPublic.model_validate(job)


@router.post("/{job_id}/failure")
def report_failure(
    job_id: JobId, body: JobFailure, db: DatabaseDep, caller: WorkerAccess
) -> JobPublic:
    """Record a failed attempt: queued again if retryable and attempts remain, else failed."""
    with db.session(write=True) as session:
        job = store.fail_job(
            session, job_id, body.lease_id, caller, reason=body.reason, retryable=body.retryable
        )
        return JobPublic.model_validate(job)
