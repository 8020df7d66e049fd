"""The recommendation: micro batch, accumulation steps and the split of one step."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from api.cache import GenerationCache
from api.db import Database
from api.deps import authorize, current_generation
from api.models import utcnow
from api.query_model import parse_query, query_openapi
from api.schemas.recommendation import RecommendationPublic, RecommendationQuery
from api.store import recommendation as store
from api.store.generation import DirectReader

router = APIRouter(prefix="/recommendation", tags=["recommendation"])


class Answer(NamedTuple):
    """An answer ready to send: its JSON but for the age, the one part that moves.

    A tuple of bytes and a datetime, which the garbage collector stops tracking: tens of
    thousands of cached answers add nothing to the time of a full collection.
    """

    head: bytes  # the JSON object without profile_age_s and without its closing brace
    measured_at: datetime

    @classmethod
    def of(cls, public: RecommendationPublic) -> Answer:
        document = public.model_dump_json(exclude={"profile_age_s"})
        return cls(document[:-1].encode(), public.profile_created_at)

    def body(self, now: datetime) -> bytes:
        age = max(0.0, (now - self.measured_at).total_seconds())
        return b'%s,"profile_age_s":%s}' % (self.head, repr(age).encode())


@router.get(
    "",
    response_model=RecommendationPublic,
    openapi_extra=query_openapi(RecommendationQuery),
)
async def get_recommendation(request: Request) -> Response:
    """Settings for a global batch on a device: measured, or estimated from another device."""
    # Every training job asks this at start-up, mostly the same few questions: an answer
    # is computed once per store generation and kept ready to send. The route takes the
    # request alone and reads its token and query itself, which halves FastAPI's own
    # share of the work (dependency and parameter solving, ~55 µs a call).
    await authorize(request, "read")
    cache: GenerationCache[Answer] = request.app.state.recommendations
    # Keyed by the query string as sent: a repeated question is answered without even
    # being parsed again (the same question spelled two ways is merely cached twice).
    key: bytes = request.scope["query_string"]
    generation = current_generation(request)
    answer = cache.get(key, generation)
    if answer is None:
        query = parse_query(request, RecommendationQuery)
        reader: DirectReader = request.app.state.reader
        if reader.inline:
            public = reader.run(
                lambda connection: store.recommend_on(
                    connection, reader.dialect, query, now=utcnow()
                )
            )
        else:
            db: Database = request.app.state.db

            def compute() -> RecommendationPublic:
                with db.session() as session:
                    return store.recommend(session, query, now=utcnow())

            public = await run_in_threadpool(compute)
        answer = Answer.of(public)
        # Read before the store was, so a write in between only makes the answer newer
        # than its generation, and the next request (seeing the new one) computes afresh.
        cache.put(key, generation, answer)
    return Response(answer.body(utcnow()), media_type="application/json")
