"""The recommendation: micro batch, accumulation steps and the split of one step.

The answer is :func:`tuner.answer.decide`'s, from the evidence the store gathers
(:mod:`api.store.evidence`); this route only reads the question and the token.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from api import service
from api.deps import DatabaseDep, ReadAccess
from tuner.core.wire.recommendation import RecommendationPublic, RecommendationQuery

router = APIRouter(prefix="/recommendation", tags=["recommendation"])


@router.get("", response_model=RecommendationPublic)
def get_recommendation(
    query: Annotated[RecommendationQuery, Query()], caller: ReadAccess, db: DatabaseDep
) -> Response:
    """Settings for a global batch on a device: measured, or estimated from another device."""
    # The answer is a RecommendationPublic already: sent as its own JSON (FastAPI's
    # "return a Response directly"), not validated a second time against response_model.
    answer = service.recommend(db, query, project_id=caller.project)
    return Response(answer.model_dump_json(), media_type="application/json")
