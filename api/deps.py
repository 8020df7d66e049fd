"""Dependencies for routes: the database, the settings, and who is calling with what scope."""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Annotated, Any

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from api.access_log import TOKEN_NAME
from api.cache import GenerationCache, SingleFlight
from api.config import ServiceSettings
from api.db import Database
from api.limits import WriteLimiter
from api.models import DEFAULT_PROJECT_ID
from api.security import ANONYMOUS_READER, TOUCH_INTERVAL, Principal, digest, require_scope
from api.store.projects import project_id_of, project_names, unknown_project
from api.store.tokens import authenticate, touch_token
from tuner.core.errors import (
    AuthenticationError,
    BadInputError,
    PermissionDeniedError,
)
from tuner.core.wire.common import PROJECT_HEADER

TOKEN_COOKIE = "tuner_token"
# The project the dashboard shows a token of every project (set by its project menu).
PROJECT_COOKIE = "tuner_project"


# Async although they only read attributes: FastAPI runs a plain `def` dependency in its
# threadpool, two thread hops a request for nothing.
_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})  # never rate limited


async def get_database(request: Request) -> Database:
    database: Database = request.app.state.db
    return database


async def get_settings(request: Request) -> ServiceSettings:
    settings: ServiceSettings = request.app.state.settings
    return settings


DatabaseDep = Annotated[Database, Depends(get_database)]
SettingsDep = Annotated[ServiceSettings, Depends(get_settings)]


def presented_token(request: Request) -> str | None:
    """The bearer token from the Authorization header, or, for reads only, from the
    dashboard's cookie.

    A browser sends the cookie with any request to this host, whichever page made it: a
    page on another port of the same machine is the same site, so even ``SameSite=Strict``
    lets it through. Writes therefore take the header only, which a page on another
    origin cannot set without the service's consent (CORS, which it never gives).
    """
    header = request.headers.get("authorization")
    if header:
        return bearer_token(header)
    if request.method not in _READ_METHODS:
        return None
    return request.cookies.get(TOKEN_COOKIE)


def bearer_token(header: str) -> str:
    """The token of an ``Authorization: Bearer <token>`` header's value."""
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise AuthenticationError("use the header `Authorization: Bearer <token>`")
    return value.strip()


def known_principal(state: Any, token: str, generation: int) -> Principal | None:
    """Who ``token`` is, if checked since the store last changed and its use was recorded
    recently enough; ``None`` means the store must be asked."""
    cache: GenerationCache[tuple[Principal, float]] = state.principals
    entry = cache.get(digest(token), generation)
    if entry is not None and time.monotonic() - entry[1] < TOUCH_INTERVAL.total_seconds():
        return entry[0]
    return None


def current_generation(request: Request) -> int:
    """The store's generation, read once per request (auth and route share it)."""
    generation: int | None = getattr(request.state, "generation", None)
    if generation is None:
        generation = request.app.state.reader.generation()
        request.state.generation = generation
    return generation


async def _principal(request: Request, token: str) -> Principal:
    """Who ``token`` is: from the cache while the store is unchanged, else from the store.

    A revocation raises the generation, so a revoked token is refused from the next
    request on, in every process.
    """
    generation = current_generation(request)
    known = known_principal(request.app.state, token, generation)
    if known is not None:
        return known
    cache: GenerationCache[tuple[Principal, float]] = request.app.state.principals
    key = digest(token)
    checks: SingleFlight[Principal] = request.app.state.principal_checks
    db: Database = request.app.state.db

    async def check_and_touch() -> Principal:
        def check() -> tuple[Principal, bool]:
            with db.session() as session:
                return authenticate(session, token)

        principal, stale = await run_in_threadpool(check)
        if stale and principal.token_id is not None:
            token_id = principal.token_id

            def touch() -> None:
                with db.session(write=True) as session:
                    touch_token(session, token_id)

            await run_in_threadpool(touch)
        cache.put(key, generation, (principal, time.monotonic()))
        return principal

    return await checks.run(key, check_and_touch)


async def project_id(request: Request, name: str) -> int:
    """The id of the project ``name``; projects are never renamed or deleted, so an id
    once read is kept for the process's life."""
    known: dict[str, int] = request.app.state.project_ids
    found = known.get(name)
    if found is not None:
        return found
    db: Database = request.app.state.db

    def read() -> int | None:
        with db.session() as session:
            return project_id_of(session, name)

    read_id = await run_in_threadpool(read)
    if read_id is None:
        raise unknown_project(name)
    known[name] = read_id
    return read_id


async def _acting(request: Request, principal: Principal) -> Principal:
    """``principal`` acting in the project the request names (``X-Tuner-Project``): any
    project for an admin token that spans them all (else the dashboard's choice, else
    ``default``); its own only for every other token. The project's name is left on the
    request for the pages."""
    asked = request.headers.get(PROJECT_HEADER)
    if principal.project_id is None:
        if asked is None and request.method in _READ_METHODS:
            asked = request.cookies.get(PROJECT_COOKIE)
        wanted = DEFAULT_PROJECT_ID if asked is None else await project_id(request, asked)
        principal = replace(principal, project_id=wanted, all_projects=True)
    elif asked is not None and await project_id(request, asked) != principal.project_id:
        raise _not_its_own(principal, asked)
    request.scope.setdefault("state", {})["project_name"] = await project_name(
        request, principal.project
    )
    return principal


async def named_project(request: Request, principal: Principal, name: str | None) -> Principal:
    """``principal`` (as :func:`authorize` made it) acting in the project a question names
    itself (``RecommendationQuery.project``), by the header's rules: any project for a
    token of every project, its own only for any other; a header that names another
    project as well is refused."""
    if name is None:
        return principal
    header = request.headers.get(PROJECT_HEADER)
    if header is not None and header != name:
        raise BadInputError(
            f"the question names project {name!r} and the {PROJECT_HEADER} header "
            f"{header!r}: name one project"
        )
    wanted = await project_id(request, name)
    if principal.all_projects:
        principal = replace(principal, project_id=wanted)
    elif wanted != principal.project_id:
        raise _not_its_own(principal, name)
    request.scope.setdefault("state", {})["project_name"] = name
    return principal


def _not_its_own(principal: Principal, name: str) -> PermissionDeniedError:
    return PermissionDeniedError(
        f"token {principal.name!r} reads and writes its own project only, not {name!r}: "
        "use a token of that project"
    )


async def project_name(request: Request, project: int) -> str:
    """The name of project ``project`` (kept once read: projects are never renamed)."""
    known: dict[int, str] = request.app.state.project_names
    if project not in known:
        db: Database = request.app.state.db

        def read() -> dict[int, str]:
            with db.session() as session:
                return project_names(session)

        known.update(await run_in_threadpool(read))
    return known.get(project, "?")


async def dashboard_reader(request: Request) -> Principal:
    """Who the dashboard's cookie names, for a form the dashboard posts that changes no
    stored row (the project it shows): the caller checks the post is same-origin, which
    is what keeps cookies out of writes."""
    token = request.cookies.get(TOKEN_COOKIE)
    if token is None:
        raise AuthenticationError("sign in first: the dashboard keeps your token in a cookie")
    return await _principal(request, token)


async def authorize(request: Request, scope: str, *alternatives: str) -> Principal:
    """The caller, if it holds ``scope`` or any one of ``alternatives``; else the error
    that says what is missing."""
    token = presented_token(request)
    if token is None:
        settings: ServiceSettings = request.app.state.settings
        if scope == "read" and settings.public_reads:
            request.scope.setdefault("state", {})[TOKEN_NAME] = ANONYMOUS_READER.name
            return ANONYMOUS_READER
        cookie_only = TOKEN_COOKIE in request.cookies
        raise AuthenticationError(
            "writes take a bearer token, never the dashboard's cookie: send "
            "`Authorization: Bearer <token>`"
            if cookie_only
            else "this request needs a token: send `Authorization: Bearer <token>` "
            "(an admin creates one with `tuner token create`)"
        )
    principal = await _acting(request, await _principal(request, token))
    request.scope.setdefault("state", {})[TOKEN_NAME] = principal.name  # for the access log
    accepted = (scope, *alternatives)
    if not any(principal.allows(one) for one in accepted):
        require_scope(principal, " or ".join(accepted))  # raises, naming what is needed
    if request.method not in _READ_METHODS:
        limiter: WriteLimiter = request.app.state.write_limiter
        limiter.check(principal)
    return principal


def _scope_dependency(
    scope: str, *alternatives: str
) -> Callable[..., Coroutine[Any, Any, Principal]]:
    """Needs ``scope``, or any one of ``alternatives``."""

    # Only the request as a parameter: every sub-dependency FastAPI solves costs a
    # request about 7 µs, and this one runs on every call.
    async def dependency(request: Request) -> Principal:
        return await authorize(request, scope, *alternatives)

    dependency.__name__ = "require_" + "_or_".join((scope, *alternatives))
    return dependency


ReadAccess = Annotated[Principal, Depends(_scope_dependency("read"))]
WriteAccess = Annotated[Principal, Depends(_scope_dependency("write"))]
WorkerAccess = Annotated[Principal, Depends(_scope_dependency("worker"))]
AdminAccess = Annotated[Principal, Depends(_scope_dependency("admin"))]
# Profiles come from people and scripts (write) and from workers (worker).
UploadAccess = Annotated[Principal, Depends(_scope_dependency("write", "worker"))]
