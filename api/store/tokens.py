"""The rows of API tokens: created, listed, revoked, found by digest, their use recorded.
What a token grants and when it is refused is :mod:`api.security`'s."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from api.models import DEFAULT_PROJECT, ApiToken, utcnow
from api.security import (
    Principal,
    digest,
    expand_scopes,
    new_token,
    presented_digest,
    principal_of,
)
from api.store.generation import mark_changed
from api.store.projects import ensure_project
from api.store.rows import get_or_404
from tuner.core.errors import BadInputError


def create_token(
    session: Session, *, name: str, scopes: list[str], project: str | None = DEFAULT_PROJECT
) -> tuple[ApiToken, str]:
    """Store a new token of ``project`` (created if new; None: every project, for an
    admin token only) and return it with its plain text, which is never stored."""
    granted = expand_scopes(scopes)
    if project is None and "admin" not in granted:
        raise BadInputError(
            "only an admin token may span every project: give this one --project NAME"
        )
    plain, prefix = new_token()
    row = ApiToken(
        name=name,
        prefix=prefix,
        digest=digest(plain),
        scopes=",".join(sorted(set(scopes))),
        project_id=None if project is None else ensure_project(session, project).id,
    )
    session.add(row)
    session.flush()
    return row, plain


def list_tokens(session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).order_by(ApiToken.id)))


def revoke_token(session: Session, token_id: int) -> ApiToken:
    row = get_or_404(
        session, ApiToken, token_id, missing="no token with id {id}; `tuner token list` shows them"
    )
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        mark_changed(session)  # cached checks of this token end with this transaction
    return row


def authenticate(session: Session, token: str) -> tuple[Principal, bool]:
    """The principal behind ``token`` and whether its last use should be recorded.

    Raises when the token is unknown or revoked. Read-only, so it runs in a read session.
    """
    computed = presented_digest(token)
    row = session.scalar(select(ApiToken).where(ApiToken.digest == computed))
    return principal_of(row, computed)


def touch_token(session: Session, token_id: int) -> None:
    session.execute(update(ApiToken).where(ApiToken.id == token_id).values(last_used_at=utcnow()))
