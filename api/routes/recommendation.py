"""The recommendation: micro batch, accumulation steps and the split of one step.

The answer is :mod:`api.answers`' (decided in ``recommendation``, kept in ``cached``);
this module only reads the request and sends the answer."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from api.access_log import TOKEN_NAME
from api.answers.cached import Answer, cached_or_computed
from api.cache import GenerationCache
from api.deps import authorize, bearer_token, current_generation, known_principal
from api.query_model import parse_query, query_openapi
from api.schemas.recommendation import RecommendationPublic, RecommendationQuery

router = APIRouter(prefix="/recommendation", tags=["recommendation"])


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


class CachedAnswers:
    """ASGI middleware: a recommendation asked with a token already checked is answered
    from here, without the framework's routing, dependencies and exception layers (half
    the time of even a bare FastAPI endpoint): from the cache when it was answered for this
    store generation, else computed and cached. Anything else, and anything unusual (no
    token, a cookie, a query that does not parse, a question the store refuses), goes on to
    the route, which answers it in full; what the client receives is the same either way
    (``tests/api/test_fast_paths.py``). Measured (``bench/fast_paths.py``): without it a
    new question costs 1.42× and a repeated one 3.77× (182 → 260 µs, 19 → 72 µs).
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
