"""API tokens: 256 random bits behind a recognisable prefix, kept only as SHA-256.

Scopes: ``read`` (GET), ``write`` (create devices, workloads, profiles, jobs, OOM reports),
``worker`` (register, claim, heartbeat, finish jobs, upload profiles) and ``admin``
(everything). ``write`` and ``worker`` include ``read``. A token reads and writes in its
own project only; an admin token may instead span every project.

This module is the policy only: what a token looks like, what it grants and when it is
refused. Its rows are read and written in :mod:`api.store.tokens`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from api.models import DEFAULT_PROJECT_ID, utcnow
from tuner.core.errors import AuthenticationError, BadInputError, PermissionDeniedError

if TYPE_CHECKING:
    from api.models import ApiToken

TOKEN_PREFIX = "mbt_"
SCOPES = ("read", "write", "worker", "admin")
_IMPLIED = {"admin": set(SCOPES), "write": {"write", "read"}, "worker": {"worker", "read"}}
# Recording every use would make every read a write; once a minute is enough to audit.
TOUCH_INTERVAL = timedelta(minutes=1)


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's id, name, scopes and project, or the anonymous public
    reader (of the project ``default``). ``project_id`` None: every project, an admin
    token's, which acts in the project a request names (:func:`api.deps.authorize`)."""

    token_id: int | None
    name: str
    scopes: frozenset[str]
    project_id: int | None = DEFAULT_PROJECT_ID
    # Set when a token of every project acts in one (the dashboard offers to switch).
    all_projects: bool = False

    def allows(self, scope: str) -> bool:
        return scope in self.scopes

    @property
    def project(self) -> int:
        """The project this request reads and writes (resolved before any route runs)."""
        if self.project_id is None:
            raise AssertionError("an all-projects token acts in the project its request names")
        return self.project_id


ANONYMOUS_READER = Principal(None, "public", frozenset({"read"}))


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> tuple[str, str]:
    """A new token's plain text (shown once, never stored) and the prefix kept to name it."""
    plain = TOKEN_PREFIX + secrets.token_urlsafe(32)  # 32 bytes = 256 bits
    return plain, plain[: len(TOKEN_PREFIX) + 6]


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


def presented_digest(token: str) -> str:
    """The digest to look ``token`` up by; refused at once when it is not one of ours."""
    if not token.startswith(TOKEN_PREFIX):
        raise AuthenticationError(
            f"the token does not look like a microbatch-tuner token ({TOKEN_PREFIX}...): "
            "create one with `tuner token create`"
        )
    return digest(token)


def principal_of(row: ApiToken | None, computed: str) -> tuple[Principal, bool]:
    """The principal of the row found by digest ``computed``, and whether its last use
    should be recorded; raises when there is none or it was revoked."""
    # The lookup is by digest; the final comparison is constant-time all the same.
    if row is None or not hmac.compare_digest(row.digest, computed):
        raise AuthenticationError("unknown token: create one with `tuner token create`")
    if row.revoked_at is not None:
        raise AuthenticationError(f"token {row.prefix}... was revoked; create a new one")
    stale = row.last_used_at is None or utcnow() - row.last_used_at > TOUCH_INTERVAL
    scopes = expand_scopes(row.scopes.split(","))
    return Principal(row.id, row.name, scopes, row.project_id), stale


# A project's name travels in headers and URLs: plain characters only.
_PROJECT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def check_project_name(name: str) -> None:
    if not _PROJECT_NAME.fullmatch(name):
        raise BadInputError(
            f"project name {name!r} is not one: use 1 to 100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )


def require_scope(principal: Principal, scope: str) -> None:
    if not principal.allows(scope):
        raise PermissionDeniedError(
            f"token {principal.name!r} lacks the {scope!r} scope this request needs"
        )
