"""A profile's variant as its row stores it, and the one rule on storing it: an exploration
chooses one variant. What storing a profile needs of variants, apart from comparing them
(:mod:`api.store.variants`, which reads stored profiles back)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from api import models
from api.store.projects import in_project
from tuner.core import results
from tuner.core.errors import ConflictError


def variant_columns(profile: results.Profile) -> dict[str, Any]:
    """The profile's variant, as its row stores it."""
    return {
        "variant": dict(profile.variant),
        "variant_group": profile.variant_group,
        "variant_chosen": profile.variant_chosen,
    }


def variant_fields(row: models.Profile) -> dict[str, Any]:
    """The row's variant, as the profile schema reads it."""
    return {
        "variant": dict(row.variant or {}),
        "variant_group": row.variant_group,
        "variant_chosen": bool(row.variant_chosen),
    }


def check_one_chosen(session: Session, profile: results.Profile, *, project_id: int) -> None:
    """Refuse a second chosen variant in one exploration of the project: it chose one (a
    retry of the same profile is recognised before this is asked). Another project's
    exploration of the same group key is its own."""
    if not profile.variant_chosen or profile.variant_group is None:
        return
    chosen = session.scalar(
        select(models.Profile.id).where(
            in_project(project_id),
            models.Profile.variant_group == profile.variant_group,
            models.Profile.variant_chosen.is_(True),
        )
    )
    if chosen is not None:
        raise ConflictError(
            f"profile {chosen} is the chosen variant of exploration {profile.variant_group} "
            "already: an exploration chooses one variant; upload this one with "
            "variant_chosen false"
        )
