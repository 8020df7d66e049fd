"""The recommendation: micro batch, accumulation steps and the split of one step."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import DatabaseDep, ReadAccess
from api.models import utcnow
from api.schemas.recommendation import RecommendationPublic, RecommendationQuery
from api.store import recommendation as store

router = APIRouter(prefix="/recommendation", tags=["recommendation"])


@router.get("")
def get_recommendation(
    db: DatabaseDep, _: ReadAccess, query: Annotated[RecommendationQuery, Query()]
) -> RecommendationPublic:
    """Settings for a global batch on a device: measured, or estimated from another device."""
    with db.session() as session:
        return store.recommend(session, query, now=utcnow())
