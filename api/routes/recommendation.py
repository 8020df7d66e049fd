"""The recommendation: micro batch, accumulation steps and the split of one step."""

from __future__ import annotations

import re
import time
from typing import Any, NamedTuple
from urllib.parse import quote_plus

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from api.access_log import TOKEN_NAME
from api.answers import recommendation as answers
from api.cache import GenerationCache
from api.db import Database
from api.deps import authorize, bearer_token, current_generation, known_principal
from api.models import utcnow
from api.query_model import parse_query, query_openapi
from api.schemas.recommendation import RecommendationPublic, RecommendationQuery
from api.store.generation import DirectReader

router = APIRouter(prefix="/recommendation", tags=["recommendation"])


class Answer(NamedTuple):
    """An answer ready to send: its JSON but for the age, the one part that moves.

    A tuple of bytes and a float, which the garbage collector stops tracking: tens of
    thousands of cached answers add nothing to the time of a full collection.
    """

    head: bytes  # the JSON object without profile_age_s and without its closing brace
    measured_at: float  # POSIX seconds

    @classmethod
    def of(cls, public: RecommendationPublic) -> Answer:
        document = public.model_dump_json(exclude={"profile_age_s"})
        return cls(document[:-1].encode(), public.profile_created_at.timestamp())

    def body(self) -> bytes:
        age = max(0.0, time.time() - self.measured_at)
        return b'%s,"profile_age_s":%s}' % (self.head, repr(age).encode())


@router.get(
    "",
    response_model=RecommendationPublic,
    openapi_extra=query_openapi(RecommendationQuery),
)
async def get_recommendation(request: Request) -> Response:
    """Settings for a global batch on a device: measured, or estimated from another device."""
    # Every training job asks this at start-up, mostly the same few questions: an answer
    # is computed once per store generation and kept ready to send, under the question's
    # key (question_key), which a query string spelled as the key finds unparsed. The
    # route takes the request alone and reads its token and query itself, which halves
    # FastAPI's own share of the work (dependency and parameter solving, ~55 µs a call).
    await authorize(request, "read")
    cache: GenerationCache[Answer] = request.app.state.recommendations
    generation = current_generation(request)
    answer = cache.get(request.scope["query_string"], generation)
    if answer is None:
        query = parse_query(request, RecommendationQuery)
        answer = await cached_or_computed(request.app.state, query, generation)
    return Response(answer.body(), media_type="application/json")


# The order the Python client asks in (tuner.client's Question), so that its questions,
# spelled as this key spells them, are found without being parsed.
QUESTION_ORDER = (
    "workload",
    "device",
    "global_batch_size",
    "world_size",
    "policy",
    "parallel",
    "seq_len",
    "tokens_per_micro_batch",
)


# The characters ``quote_plus`` leaves as they are.
_UNQUOTED = re.compile(r"[A-Za-z0-9_.~-]*")


def question_key(query: RecommendationQuery) -> bytes:
    """The question's cache key: its validated fields, query-encoded in one order.

    A question spelled another way (parameters reordered, padded with ``&``, a number
    written ``064``) has the same key, so a client cannot grow the cache by respelling one
    question; a request whose query string *is* the key (as the Python client sends it) is
    looked up before being parsed, the cached answer's fast path.
    """
    # What ``urlencode`` of the fields would give, without its cost where a value needs no
    # quoting (keys, numbers, modes: nearly every question): 15 us of a cold answer's 190.
    parts = []
    for name in QUESTION_ORDER:
        value = getattr(query, name)
        if value is None:
            continue
        text = str(value)  # strings, whole numbers and modes (Literal strings)
        parts.append(f"{name}={text if _UNQUOTED.fullmatch(text) else quote_plus(text)}")
    return "&".join(parts).encode()


async def cached_or_computed(state: Any, query: RecommendationQuery, generation: int) -> Answer:
    """The answer to ``query``: cached under its key, or computed and cached."""
    key = question_key(query)
    cache: GenerationCache[Answer] = state.recommendations
    return cache.get(key, generation) or await computed_answer(state, query, key, generation)


async def computed_answer(
    state: Any, query: RecommendationQuery, key: bytes, generation: int
) -> Answer:
    """The answer to ``query`` from the store, kept for ``generation`` under ``key``."""
    reader: DirectReader = state.reader
    if reader.inline:
        public = reader.run(
            lambda connection: answers.recommend_on(connection, reader.dialect, query, now=utcnow())
        )
    else:
        db: Database = state.db

        def compute() -> RecommendationPublic:
            with db.session() as session:
                return answers.recommend(session, query, now=utcnow())

        public = await run_in_threadpool(compute)
    answer = Answer.of(public)
    # Read before the store was, so a write in between only makes the answer newer than
    # its generation, and the next request (seeing the new one) computes afresh.
    cache: GenerationCache[Answer] = state.recommendations
    cache.put(key, generation, answer)
    return answer


class CachedAnswers:
    """ASGI middleware: a recommendation asked with a token already checked is answered
    from here, without the framework's routing, dependencies and exception layers (half
    the time of even a bare FastAPI endpoint): from the cache when it was answered for this
    store generation, else computed and cached. Anything else, and anything unusual (no
    token, a cookie, a query that does not parse, a question the store refuses), goes on to
    the route, which answers it in full; what the client receives is the same either way.
    """

    def __init__(self, app: ASGIApp, *, path: str) -> None:
        self.app = app
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == self.path and scope["method"] == "GET":
            generation = self._checked_generation(scope)
            if generation is not None:
                state = scope["app"].state
                cache: GenerationCache[Answer] = state.recommendations
                # A repeated question (most of them) costs one lookup, nothing awaited.
                answer = cache.get(scope["query_string"], generation) or await _computed(
                    scope, generation
                )
                if answer is not None:
                    body = answer.body()
                    await send(
                        {
                            "type": "http.response.start",
                            "status": 200,
                            "headers": [
                                (b"content-length", b"%d" % len(body)),
                                (b"content-type", b"application/json"),
                            ],
                        }
                    )
                    await send({"type": "http.response.body", "body": body})
                    return
        await self.app(scope, receive, send)

    def _checked_generation(self, scope: Scope) -> int | None:
        """The store's generation, when the request may read and the route need not say
        anything about its token; ``None`` sends it on to the route."""
        state = scope["app"].state
        # The first of each header, as the route reads them.
        authorization = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if authorization is None:
            has_cookie = any(k == b"cookie" for k, _ in scope["headers"])
            if has_cookie or not state.settings.public_reads:
                return None  # the route reads the dashboard's cookie, or says what is missing
        try:
            generation: int = state.reader.generation()
            scope.setdefault("state", {})["generation"] = generation  # the route's, if it goes on
            if authorization is not None:
                token = bearer_token(authorization.decode("latin-1"))
                principal = known_principal(state, token, generation)
                if principal is None or not principal.allows("read"):
                    return None
                scope["state"][TOKEN_NAME] = principal.name  # for the access log
        except Exception:
            return None  # the route will meet the same trouble and answer it properly
        return generation


async def _computed(scope: Scope, generation: int) -> Answer | None:
    """The answer found under the question's key or computed here, or ``None`` to let the
    route meet the trouble (a query that does not parse, a question the store refuses) and
    answer it properly."""
    try:
        query = parse_query(Request(scope), RecommendationQuery)
        return await cached_or_computed(scope["app"].state, query, generation)
    except Exception:
        return None
