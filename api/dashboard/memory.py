"""The landing page remembers each reader's last question.

A question is the calculator's query string (the fields the reader set, as the page's URL
carries them). It is kept in a cookie named after the token that asked it
(``tuner_question_<token id>``; ``tuner_question_public`` for public reads), so two tokens
signed in one after the other in the same browser each keep their own, and nothing is
written to the store: the dashboard only reads. The cookie holds the project the question
was asked in, and is read back only in that project: a token of every project that
switches project does not carry a question over, so its rows are never asked about in
another project (where the same key would name nothing, or something else).
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import parse_qsl, quote, unquote, urlencode

from fastapi import Request
from fastapi.responses import Response

from api.dashboard.calculator import QUESTION_FIELDS
from api.security import Principal

COOKIE_PREFIX = "tuner_question_"
# Kept as long as a reader comes back to it; asking again renews it.
REMEMBER_S = 180 * 24 * 3600
# Far more than a question's eight short fields need; a larger cookie is ignored.
LONGEST = 1024


def cookie_name(principal: Principal) -> str:
    return COOKIE_PREFIX + (str(principal.token_id) if principal.token_id is not None else "public")


def asked(params: Mapping[str, str]) -> dict[str, str]:
    """The question's fields in ``params`` (a query string's mapping), blank ones left out."""
    return {name: params[name].strip() for name in QUESTION_FIELDS if params.get(name, "").strip()}


def recall(request: Request, principal: Principal) -> str | None:
    """The reader's last question in this project, as a query string; ``None`` when none
    was kept, it was asked in another project, or the cookie is not one this page wrote."""
    raw = request.cookies.get(cookie_name(principal))
    if not raw or len(raw) > LONGEST:
        return None
    project, _, query = raw.partition(":")
    if project != str(principal.project):
        return None
    fields = {k: v for k, v in parse_qsl(unquote(query)) if k in QUESTION_FIELDS and v}
    return urlencode(fields) or None


def remember(response: Response, principal: Principal, fields: dict[str, str]) -> None:
    """Keep ``fields`` as the reader's last question in this project."""
    value = f"{principal.project}:{quote(urlencode(fields), safe='')}"
    if len(value) > LONGEST:
        return
    response.set_cookie(
        cookie_name(principal),
        value,
        max_age=REMEMBER_S,
        path="/",
        secure=True,
        httponly=True,
        samesite="strict",
    )
