"""Profiles: uploaded whole by the CLI, workers and clients; listed; read with probes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response, status

from api.deps import DatabaseDep, ReadAccess, UploadAccess
from api.schemas.common import INT32_MAX
from api.schemas.profiles import (
    PrintedProfile,
    ProfilePublic,
    ProfileQuery,
    ProfileReportCreate,
    ProfilesCreated,
    ProfilesPublic,
)
from api.schemas.variants import VariantsPublic
from api.store import profiles as store
from api.store.variants import variants_of

router = APIRouter(prefix="/profiles", tags=["profiles"])

ProfileId = Annotated[int, Path(ge=1, le=INT32_MAX, description="the profile's id")]


@router.post("", status_code=status.HTTP_201_CREATED)
def create_profile(
    body: PrintedProfile, db: DatabaseDep, caller: UploadAccess, response: Response
) -> ProfilePublic | ProfilesCreated:
    """Store a profile with its probes, as ``tuner profile --json`` prints it (201; the same
    profile sent again answers 200); a ``--seq-lens`` document stores every length's
    profile, all or none."""
    printed = body.profiles if not isinstance(body, ProfileReportCreate) else [body]
    with db.session(write=True) as session:
        saved = [
            store.save_profile(session, profile.create(), registered_by=caller.token_id)
            for profile in printed
        ]
        if not any(created for _, created in saved):
            response.status_code = status.HTTP_200_OK
        stored = [store.to_public(row) for row, _ in saved]
    if isinstance(body, ProfileReportCreate):
        return stored[0]
    return ProfilesCreated(data=stored, count=len(stored))


@router.get("")
def list_profiles(
    db: DatabaseDep, _: ReadAccess, query: Annotated[ProfileQuery, Query()]
) -> ProfilesPublic:
    """List profiles, newest first, by workload, device and creation time."""
    with db.session() as session:
        rows, count, token = store.list_profiles(session, query)
        return ProfilesPublic(
            data=[store.to_summary(row) for row in rows], count=count, next_page_token=token
        )


@router.get("/{profile_id}")
def get_profile(profile_id: ProfileId, db: DatabaseDep, _: ReadAccess) -> ProfilePublic:
    """One profile with its probes."""
    with db.session() as session:
        return store.to_public(store.get_profile(session, profile_id))


@router.get("/{profile_id}/variants")
def get_variants(profile_id: ProfileId, db: DatabaseDep, _: ReadAccess) -> VariantsPublic:
    """The variants explored with this profile (``tuner profile --explore``), compared."""
    with db.session() as session:
        return variants_of(session, store.get_profile(session, profile_id))
