"""Workloads: created by the first profile uploaded for them, or registered ahead."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response, status

from api.deps import DatabaseDep, ReadAccess, UploadAccess
from api.store import profiles as store
from tuner.core.wire.common import INT32_MAX, QueryInt
from tuner.core.wire.workloads import WorkloadCreate, WorkloadPublic, WorkloadQuery, WorkloadsPublic

router = APIRouter(prefix="/workloads", tags=["workloads"])

WorkloadId = Annotated[QueryInt, Path(ge=1, le=INT32_MAX, description="the workload's id")]


@router.post("", status_code=status.HTTP_201_CREATED)
def create_workload(
    body: WorkloadCreate, db: DatabaseDep, caller: UploadAccess, response: Response
) -> WorkloadPublic:
    """Register a workload by its key (201; the same registration again answers 200)."""
    with db.session(write=True) as session:
        workload, created = store.create_workload(
            session, body, project_id=caller.project, registered_by=caller.token_id
        )
        if not created:
            response.status_code = status.HTTP_200_OK
        return WorkloadPublic.model_validate(workload)


@router.get("")
def list_workloads(
    db: DatabaseDep, caller: ReadAccess, query: Annotated[WorkloadQuery, Query()]
) -> WorkloadsPublic:
    """List the project's workloads, newest first, optionally by name."""
    with db.session() as session:
        rows, count, token = store.list_workloads(
            session, query, project_id=caller.project, name=query.name
        )
        return WorkloadsPublic(
            data=[WorkloadPublic.model_validate(row) for row in rows],
            count=count,
            next_page_token=token,
        )


@router.get("/{workload_id}")
def get_workload(workload_id: WorkloadId, db: DatabaseDep, caller: ReadAccess) -> WorkloadPublic:
    """One workload of the project."""
    with db.session() as session:
        workload = store.get_workload(session, workload_id, project_id=caller.project)
        return WorkloadPublic.model_validate(workload)
