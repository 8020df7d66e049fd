"""Profiles: uploaded whole by the CLI, workers and clients; listed; read with probes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response, status

from api import service
from api.deps import DatabaseDep, ReadAccess, UploadAccess
from api.store import profiles as store
from api.store.variants import variants_of
from tuner.core import memory_viz
from tuner.core.wire.common import INT32_MAX, QueryInt
from tuner.core.wire.profiles import (
    PrintedProfile,
    ProfilePublic,
    ProfileQuery,
    ProfilesCreated,
    ProfilesPublic,
)
from tuner.core.wire.variants import VariantsPublic

router = APIRouter(prefix="/profiles", tags=["profiles"])

ProfileId = Annotated[QueryInt, Path(ge=1, le=INT32_MAX, description="the profile's id")]


@router.post("", status_code=status.HTTP_201_CREATED)
def create_profile(
    body: PrintedProfile, db: DatabaseDep, caller: UploadAccess, response: Response
) -> ProfilePublic | ProfilesCreated:
    """Store a profile with its probes, as ``tuner profile --json`` prints it (201; the same
    profile sent again answers 200); a ``--seq-lens`` document stores every length's
    profile, all or none."""
    stored, created = service.upload_profiles(
        db, body, registered_by=caller.token_id, project_id=caller.project
    )
    if not created:
        response.status_code = status.HTTP_200_OK
    return stored


@router.get("")
def list_profiles(
    db: DatabaseDep, caller: ReadAccess, query: Annotated[ProfileQuery, Query()]
) -> ProfilesPublic:
    """List profiles, newest first, by workload, device and creation time."""
    return service.list_profiles(db, query, project_id=caller.project)


@router.get("/{profile_id}")
def get_profile(profile_id: ProfileId, db: DatabaseDep, caller: ReadAccess) -> ProfilePublic:
    """One profile with its probes."""
    return service.get_profile(db, profile_id, project_id=caller.project)


@router.get(
    "/{profile_id}/memory-snapshot",
    response_class=Response,
    responses={200: {"content": {memory_viz.MEDIA_TYPE: {}}}},
)
def get_memory_snapshot(profile_id: ProfileId, db: DatabaseDep, caller: ReadAccess) -> Response:
    """The memory timeline of the step at M*, as a pickled snapshot that PyTorch's memory
    viewer (pytorch.org/memory_viz) opens; 404 when none was recorded."""
    name, content = service.memory_snapshot(db, profile_id, project_id=caller.project)
    return Response(
        content,
        media_type=memory_viz.MEDIA_TYPE,
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )


@router.get("/{profile_id}/variants")
def get_variants(profile_id: ProfileId, db: DatabaseDep, caller: ReadAccess) -> VariantsPublic:
    """The variants explored with this profile (``tuner profile --explore``), compared."""
    with db.session() as session:
        return variants_of(
            session, store.get_profile(session, profile_id, project_id=caller.project)
        )
