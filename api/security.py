"""API tokens: 256 random bits behind a recognisable prefix, kept only as SHA-256.

Scopes: ``read`` (GET), ``write`` (create devices, workloads, profiles, jobs, OOM reports),
``worker`` (register, claim, heartbeat, finish jobs, upload profiles) and ``admin``
(everything). ``write`` and ``worker`` include ``read``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from api.models import ApiToken, utcnow
from api.store.generation import mark_changed
from tuner.core.errors import (
    AuthenticationError,
    BadInputError,
    NotFoundError,
    PermissionDeniedError,
)

TOKEN_PREFIX = "mbt_"
SCOPES = ("read", "write", "worker", "admin")
_IMPLIED = {"admin": set(SCOPES), "write": {"write", "read"}, "worker": {"worker", "read"}}


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's id, name and scopes, or the anonymous public reader."""

    token_id: int | None
    name: str
    scopes: frozenset[str]

    def allows(self, scope: str) -> bool:
        return scope in self.scopes


ANONYMOUS_READER = Principal(None, "public", frozenset({"read"}))


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def expand_scopes(scopes: list[str]) -> frozenset[str]:
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown or not scopes:
        raise BadInputError(
            f"unknown scope(s) {', '.join(unknown) or '(none given)'}: use {', '.join(SCOPES)}"
        )
    granted: set[str] = set()
    for scope in scopes:
        granted |= _IMPLIED.get(scope, {scope})
    return frozenset(granted)


def create_token(session: Session, *, name: str, scopes: list[str]) -> tuple[ApiToken, str]:
    """Store a new token and return it with its plain text, which is never stored."""
    expand_scopes(scopes)
    plain = TOKEN_PREFIX + secrets.token_urlsafe(32)  # 32 bytes = 256 bits
    row = ApiToken(
        name=name,
        prefix=plain[: len(TOKEN_PREFIX) + 6],
        digest=digest(plain),
        scopes=",".join(sorted(set(scopes))),
    )
    session.add(row)
    session.flush()
    return row, plain


def list_tokens(session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).order_by(ApiToken.id)))


def revoke_token(session: Session, token_id: int) -> ApiToken:
    row = session.get(ApiToken, token_id)
    if row is None:
        raise NotFoundError(f"no token with id {token_id}; `tuner token list` shows them")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        mark_changed(session)  # cached checks of this token end with this transaction
    return row


# Recording every use would make every read a write; once a minute is enough to audit.
TOUCH_INTERVAL = timedelta(minutes=1)


def authenticate(session: Session, token: str) -> tuple[Principal, bool]:
    """The principal behind ``token`` and whether its last use should be recorded.

    Raises when the token is unknown or revoked. Read-only, so it runs in a read session.
    """
    if not token.startswith(TOKEN_PREFIX):
        raise AuthenticationError(
            f"the token does not look like a microbatch-tuner token ({TOKEN_PREFIX}...): "
            "create one with `tuner token create`"
        )
    computed = digest(token)
    row = session.scalar(select(ApiToken).where(ApiToken.digest == computed))
    # The lookup is by digest; the final comparison is constant-time all the same.
    if row is None or not hmac.compare_digest(row.digest, computed):
        raise AuthenticationError("unknown token: create one with `tuner token create`")
    if row.revoked_at is not None:
        raise AuthenticationError(f"token {row.prefix}... was revoked; create a new one")
    stale = row.last_used_at is None or utcnow() - row.last_used_at > TOUCH_INTERVAL
    return Principal(row.id, row.name, expand_scopes(row.scopes.split(","))), stale


def touch_token(session: Session, token_id: int) -> None:
    session.execute(update(ApiToken).where(ApiToken.id == token_id).values(last_used_at=utcnow()))


def require_scope(principal: Principal, scope: str) -> None:
    if not principal.allows(scope):
        raise PermissionDeniedError(
            f"token {principal.name!r} lacks the {scope!r} scope this request needs"
        )
