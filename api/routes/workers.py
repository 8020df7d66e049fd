"""Workers: register a GPU host's device, say it is alive, and claim jobs for that device."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response, status

from api import service
from api.deps import DatabaseDep, ReadAccess, SettingsDep, WorkerAccess
from api.store import jobs as store
from tuner.core.wire.common import INT32_MAX, QueryInt
from tuner.core.wire.jobs import JobClaim
from tuner.core.wire.workers import WorkerCreate, WorkerPublic, WorkersPublic

router = APIRouter(prefix="/workers", tags=["workers"])

WorkerId = Annotated[QueryInt, Path(ge=1, le=INT32_MAX, description="the id registration gave")]


@router.post("", status_code=status.HTTP_201_CREATED)
def register_worker(
    body: WorkerCreate, db: DatabaseDep, caller: WorkerAccess, response: Response
) -> WorkerPublic:
    """Register a worker and its device (the device is created if new): 201; the same
    registration again under its idempotency key answers 200 with that worker."""
    worker, created = service.register_worker(db, body, caller)
    if not created:
        response.status_code = status.HTTP_200_OK
    return worker


@router.get("")
def list_workers(db: DatabaseDep, caller: ReadAccess) -> WorkersPublic:
    """List the project's workers with their devices and last sign of life."""
    with db.session() as session:
        rows = store.list_workers(session, project_id=caller.project)
        workers = [service.worker_public(worker) for worker in rows]
    return WorkersPublic(data=workers, count=len(workers))


@router.post("/{worker_id}/heartbeat")
def heartbeat(worker_id: WorkerId, db: DatabaseDep, caller: WorkerAccess) -> WorkerPublic:
    """Record that the worker is alive (only its own token, or an admin's, may)."""
    with db.session(write=True) as session:
        return service.worker_public(store.touch_worker(session, worker_id, caller))


@router.post("/{worker_id}/leave")
def leave(worker_id: WorkerId, db: DatabaseDep, caller: WorkerAccess) -> WorkerPublic:
    """The worker stops on purpose (only its own token, or an admin's, may say so): the
    dashboard shows it as gone rather than silent."""
    return service.leave_worker(db, worker_id, caller)


@router.post(
    "/{worker_id}/claim",
    response_model=JobClaim,
    responses={204: {"description": "no queued job for this worker's device"}},
)
def claim(
    worker_id: WorkerId,
    db: DatabaseDep,
    settings: SettingsDep,
    caller: WorkerAccess,
    ranks: Annotated[
        QueryInt,
        Query(
            ge=1, le=2**20, description="ranks the worker can run: devices, or processes on a CPU"
        ),
    ] = 1,
) -> JobClaim | Response:
    """Claim the oldest queued job for the worker's device and ranks under a lease; 204
    when none."""
    claimed = service.claim_job(
        db, worker_id, caller, lease_seconds=settings.lease_seconds, ranks=ranks
    )
    if claimed is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return claimed
