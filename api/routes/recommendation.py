"""The recommendation: micro batch, accumulation steps and the split of one step.

The answer is :func:`tuner.answer.decide`'s, from the evidence the store gathers
(:mod:`api.store.evidence`); this route only reads the question and the token.
"""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from api import service
from api.db import Database
from api.deps import DatabaseDep, ReadAccess, named_project
from tuner.core.errors import BadInputError
from tuner.core.wire.recommendation import (
    MAX_FLAT_SPLIT,
    RecommendationParams,
    RecommendationPublic,
)

router = APIRouter(prefix="/recommendation", tags=["recommendation"])


@router.get("", response_model=RecommendationPublic)
async def get_recommendation(
    request: Request,
    query: Annotated[RecommendationParams, Query()],
    caller: ReadAccess,
    db: DatabaseDep,
) -> Response:
    """Settings for a global batch on a device: measured, or estimated from another device."""
    caller = await named_project(request, caller, query.project)
    # Never on the event loop that answers /healthz, and a few answers at a time.
    return await service.in_answer_thread(request, respond, db, query, caller.project)


def respond(db: Database, query: RecommendationParams, project_id: int) -> Response:
    """The answer to ``query`` in the project, as the response body, its split as
    ``query.split`` asks."""
    answer = service.recommend(db, query, project_id=project_id)
    if query.split == "flat":
        return Response(json.dumps(flat_body(answer)), media_type="application/json")
    # The answer is a RecommendationPublic already: sent as its own JSON (FastAPI's
    # "return a Response directly"), not validated a second time against response_model.
    return Response(answer.model_dump_json(), media_type="application/json")


def flat_body(answer: RecommendationPublic) -> dict[str, object]:
    """The answer's JSON with every micro batch listed, while there are at most
    ``MAX_FLAT_SPLIT`` of them: beyond, the list would be what the runs exist to avoid."""
    if answer.grad_accum > MAX_FLAT_SPLIT:
        raise BadInputError(
            f"split=flat lists at most {MAX_FLAT_SPLIT} micro batches and this step has "
            f"{answer.grad_accum}: use the runs (split=runs, the default), [[size, count], ...]"
        )
    body = answer.model_dump(mode="json")
    body["split"] = answer.flat_split()
    return body
