"""Devices: registered by workers, or created by the first profile uploaded from them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response, status

from api.deps import DatabaseDep, ReadAccess, UploadAccess
from api.store import profiles as store
from tuner.core.wire.common import INT32_MAX, QueryInt
from tuner.core.wire.devices import DeviceCreate, DevicePublic, DeviceQuery, DevicesPublic

router = APIRouter(prefix="/devices", tags=["devices"])

DeviceId = Annotated[QueryInt, Path(ge=1, le=INT32_MAX, description="the device's id")]


@router.post("", status_code=status.HTTP_201_CREATED)
def create_device(
    body: DeviceCreate, db: DatabaseDep, caller: UploadAccess, response: Response
) -> DevicePublic:
    """Register a device by its key (201; the same registration again answers 200)."""
    with db.session(write=True) as session:
        device, created = store.create_device(
            session, body, project_id=caller.project, registered_by=caller.token_id
        )
        if not created:
            response.status_code = status.HTTP_200_OK
        return DevicePublic.model_validate(device)


@router.get("")
def list_devices(
    db: DatabaseDep, caller: ReadAccess, query: Annotated[DeviceQuery, Query()]
) -> DevicesPublic:
    """List the project's devices, newest first, optionally by kind and name."""
    with db.session() as session:
        rows, count, token = store.list_devices(
            session, query, project_id=caller.project, kind=query.kind, name=query.name
        )
        return DevicesPublic(
            data=[DevicePublic.model_validate(row) for row in rows],
            count=count,
            next_page_token=token,
        )


@router.get("/{device_id}")
def get_device(device_id: DeviceId, db: DatabaseDep, caller: ReadAccess) -> DevicePublic:
    """One device of the project."""
    with db.session() as session:
        device = store.get_device(session, device_id, project_id=caller.project)
        return DevicePublic.model_validate(device)
