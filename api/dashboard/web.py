"""The dashboard's HTML plumbing: templates, security headers, static URLs, and the
login cookie.

Every page is server-rendered with a Content-Security-Policy that allows scripts and
styles from this origin only, so the templates carry no inline script or style: values
the browser's scripts need travel in ``data-*`` attributes, and bar widths are SVG
attributes rather than ``style``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from api.dashboard.format import install_filters
from api.deps import PROJECT_COOKIE, TOKEN_COOKIE
from api.security import Principal
from tuner.core import __version__

PACKAGE = Path(__file__).resolve().parent
TEMPLATES = PACKAGE / "templates"
STATIC = PACKAGE / "static"

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    )
)
HTML_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    # Pages show what a token may read: never keep them in a shared cache.
    "Cache-Control": "no-store",
}
# The token stays in the browser for a working month; revoking it ends the session at once,
# since every request authenticates it again.
COOKIE_MAX_AGE_S = 30 * 24 * 3600


@cache
def _asset_version(relative: str) -> str:
    """A content hash in each static URL, so a new release is never served from cache."""
    return hashlib.sha256((STATIC / relative).read_bytes()).hexdigest()[:10]


def static_url(relative: str) -> str:
    return f"/static/{relative}?v={_asset_version(relative)}"


@cache
def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(("html",)),
        auto_reload=False,  # templates ship with the package; no stat() per page
        trim_blocks=True,
        lstrip_blocks=True,
    )
    install_filters(env)
    env.globals.update(static=static_url, version=__version__, urlencode=urlencode)
    return env


def render(
    request: Request,
    template: str,
    *,
    principal: Principal | None = None,
    status_code: int = 200,
    **context: Any,
) -> HTMLResponse:
    public_reads = bool(getattr(request.app.state.settings, "public_reads", False))
    html = (
        environment()
        .get_template(template)
        .render(
            request=request,
            principal=principal,
            # The project the pages show (api.deps.authorize leaves its name).
            project=getattr(request.state, "project_name", None),
            public_reads=public_reads,
            path=request.url.path,
            **context,
        )
    )
    return HTMLResponse(html, status_code=status_code, headers=HTML_HEADERS)


def is_htmx(request: Request) -> bool:
    return request.headers.get("hx-request") == "true"


def safe_next(value: str | None) -> str:
    """Where to go after logging in: a path on this site, never another site."""
    if (
        not value
        or not value.startswith("/")
        or value.startswith("//")
        or "\\" in value
        or value.startswith("/login")
    ):
        return "/"
    return value


def login_redirect(request: Request, *, reason: str | None) -> Response:
    """Send a browser to the login form, back to this page afterwards. An htmx request
    (filters, polling) gets the same instruction as a header, so the whole page moves."""
    params = {"next": request.url.path + (f"?{request.url.query}" if request.url.query else "")}
    if reason:
        params["reason"] = reason
    target = "/login?" + urlencode(params)
    response: Response
    if is_htmx(request):
        response = Response(status_code=204, headers={"HX-Redirect": target})
    else:
        response = RedirectResponse(target, status_code=303)
    if reason:
        forget_token(response)
    return response


def remember_token(response: Response, token: str) -> None:
    _keep(response, TOKEN_COOKIE, token)


def remember_project(response: Response, name: str) -> None:
    """The project a token of every project is shown (read by api.deps for reads only)."""
    _keep(response, PROJECT_COOKIE, name)


def _keep(response: Response, name: str, value: str) -> None:
    # Secure and http-only; strict same-site: the dashboard's own pages only.
    response.set_cookie(
        name,
        value,
        max_age=COOKIE_MAX_AGE_S,
        path="/",
        secure=True,
        httponly=True,
        samesite="strict",
    )


def forget_token(response: Response) -> None:
    response.delete_cookie(TOKEN_COOKIE, path="/", secure=True, httponly=True, samesite="strict")


def same_origin(request: Request) -> bool:
    """Whether a form post comes from this site's own pages (browsers send ``Origin``)."""
    origin = request.headers.get("origin")
    if origin is None:
        return True  # not a browser's cross-site post: those always say where they come from
    host = request.headers.get("host", "")
    return origin in (f"http://{host}", f"https://{host}")


def cookie_would_be_dropped(request: Request) -> bool:
    """A ``Secure`` cookie is kept only over HTTPS, or over HTTP to this machine itself."""
    if request.url.scheme == "https":
        return False
    host = (request.url.hostname or "").lower()
    return not (host in ("localhost", "::1") or host.startswith("127."))


@dataclass(frozen=True)
class Segment:
    """One part of a stacked bar, in SVG user units of a 1000-wide bar."""

    label: str
    value: int
    css: str
    x: float
    width: float


def stack(parts: list[tuple[str, int, str]], whole: int) -> list[Segment]:
    """Lay ``parts`` side by side on a bar where ``whole`` spans the full width; a part
    that is negative (measurement noise in the activations) takes no room."""
    scale = 1000 / whole if whole > 0 else 0.0
    segments, x = [], 0.0
    for label, value, css in parts:
        width = max(0.0, value * scale)
        width = min(width, 1000 - x)
        segments.append(Segment(label, value, css, round(x, 2), round(width, 2)))
        x += width
    return segments
