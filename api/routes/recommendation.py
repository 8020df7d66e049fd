"""The recommendation: micro batch, accumulation steps and the split of one step."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from api.cache import GenerationCache
from api.deps import DatabaseDep, ReadAccess, current_generation
from api.models import utcnow
from api.schemas.recommendation import RecommendationPublic, RecommendationQuery
from api.store import recommendation as store

router = APIRouter(prefix="/recommendation", tags=["recommendation"])

# The answer as JSON, and when its profile was measured (its age is the one moving part).
Answer = tuple[dict[str, Any], datetime]


@router.get("", response_model=RecommendationPublic)
async def get_recommendation(
    request: Request,
    db: DatabaseDep,
    _: ReadAccess,
    query: Annotated[RecommendationQuery, Query()],
) -> JSONResponse:
    """Settings for a global batch on a device: measured, or estimated from another device."""
    # Every training job of a fleet asks this at start-up, mostly the same few questions:
    # an answer is computed once per store generation and kept ready to send.
    cache: GenerationCache[Answer] = request.app.state.recommendations
    key = (query.workload, query.device, query.global_batch_size, query.world_size, query.policy)
    generation = current_generation(request)
    answer = cache.get(key, generation)
    if answer is None:

        def compute() -> Answer:
            with db.session() as session:
                public = store.recommend(session, query, now=utcnow())
            return public.model_dump(mode="json"), public.profile_created_at

        answer = await run_in_threadpool(compute)
        cache.put(key, generation, answer)
    document, measured_at = answer
    age = max(0.0, (utcnow() - measured_at).total_seconds())
    return JSONResponse({**document, "profile_age_s": age})
