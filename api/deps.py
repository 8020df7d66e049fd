"""Dependencies for routes: the database, the settings, and who is calling with what scope."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request

from api.config import ServiceSettings
from api.db import Database
from api.security import ANONYMOUS_READER, Principal, authenticate, require_scope, touch_token
from tuner.errors import AuthenticationError

TOKEN_COOKIE = "tuner_token"


def get_database(request: Request) -> Database:
    database: Database = request.app.state.db
    return database


def get_settings(request: Request) -> ServiceSettings:
    settings: ServiceSettings = request.app.state.settings
    return settings


DatabaseDep = Annotated[Database, Depends(get_database)]
SettingsDep = Annotated[ServiceSettings, Depends(get_settings)]


def presented_token(request: Request) -> str | None:
    """The bearer token from the Authorization header, or from the dashboard's cookie."""
    header = request.headers.get("authorization")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise AuthenticationError("use the header `Authorization: Bearer <token>`")
        return value.strip()
    return request.cookies.get(TOKEN_COOKIE)


def _scope_dependency(scope: str, *alternatives: str) -> Callable[..., Principal]:
    """Needs ``scope``, or any one of ``alternatives``."""

    def dependency(request: Request, db: DatabaseDep, settings: SettingsDep) -> Principal:
        token = presented_token(request)
        if token is None:
            if scope == "read" and settings.public_reads:
                return ANONYMOUS_READER
            raise AuthenticationError(
                "this request needs a token: send `Authorization: Bearer <token>` "
                "(an admin creates one with `tuner token create`)"
            )
        with db.session() as session:
            principal, stale = authenticate(session, token)
        accepted = (scope, *alternatives)
        if not any(principal.allows(one) for one in accepted):
            require_scope(principal, " or ".join(accepted))  # raises, naming what is needed
        if stale and principal.token_id is not None:
            with db.session(write=True) as session:
                touch_token(session, principal.token_id)
        return principal

    dependency.__name__ = "require_" + "_or_".join((scope, *alternatives))
    return dependency


ReadAccess = Annotated[Principal, Depends(_scope_dependency("read"))]
WriteAccess = Annotated[Principal, Depends(_scope_dependency("write"))]
WorkerAccess = Annotated[Principal, Depends(_scope_dependency("worker"))]
AdminAccess = Annotated[Principal, Depends(_scope_dependency("admin"))]
# Profiles come from people and scripts (write) and from workers (worker).
UploadAccess = Annotated[Principal, Depends(_scope_dependency("write", "worker"))]
