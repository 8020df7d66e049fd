"""Profiling jobs: queue them, watch them, and (as a worker) heartbeat and finish them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response, status

from api import service
from api.deps import DatabaseDep, ReadAccess, SettingsDep, WorkerAccess, WriteAccess
from tuner.core.wire.common import INT32_MAX, QueryInt
from tuner.core.wire.jobs import (
    JobCreate,
    JobFailure,
    JobPublic,
    JobQuery,
    JobResult,
    JobsPublic,
    Lease,
    LeaseRef,
)

router = APIRouter(prefix="/jobs", tags=["jobs"])

JobId = Annotated[QueryInt, Path(ge=1, le=INT32_MAX, description="the job's id")]


@router.post("", status_code=201)
def create_job(
    body: JobCreate, db: DatabaseDep, settings: SettingsDep, caller: WriteAccess, response: Response
) -> JobPublic:
    """Queue a profiling job for a device (its key or its name): 201; the same request
    again under its idempotency key answers 200 with the job it queued."""
    job, created = service.queue_job(
        db,
        body,
        max_attempts=settings.max_attempts,
        token_id=caller.token_id,
        project_id=caller.project,
    )
    if not created:
        response.status_code = status.HTTP_200_OK
    return job


@router.get("")
def list_jobs(
    db: DatabaseDep, caller: ReadAccess, query: Annotated[JobQuery, Query()]
) -> JobsPublic:
    """List jobs, newest first, optionally by status and device."""
    return service.list_jobs(db, query, project_id=caller.project)


@router.get("/{job_id}")
def get_job(job_id: JobId, db: DatabaseDep, caller: ReadAccess) -> JobPublic:
    """One job, with its status, attempts and error."""
    return service.get_job(db, job_id, project_id=caller.project)


@router.post("/{job_id}/heartbeat")
def heartbeat(
    job_id: JobId, body: LeaseRef, db: DatabaseDep, settings: SettingsDep, caller: WorkerAccess
) -> Lease:
    """Extend the lease on a running job; 409 when the lease is no longer current, 403 for
    a token that did not register the worker holding it."""
    return service.extend_lease(
        db, job_id, body.lease_id, caller, lease_seconds=settings.lease_seconds
    )


@router.post("/{job_id}/result")
def submit_result(
    job_id: JobId, body: JobResult, db: DatabaseDep, caller: WorkerAccess
) -> JobPublic:
    """Store the job's profile and mark it succeeded; 409 under a stale lease."""
    return service.complete_job(db, job_id, body.lease_id, caller, body.profile)


@router.post("/{job_id}/failure")
def report_failure(
    job_id: JobId, body: JobFailure, db: DatabaseDep, caller: WorkerAccess
) -> JobPublic:
    """Record a failed attempt: queued again if retryable and attempts remain, else failed."""
    return service.fail_job(
        db, job_id, body.lease_id, caller, reason=body.reason, retryable=body.retryable
    )
