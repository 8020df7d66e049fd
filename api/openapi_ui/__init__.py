"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) served from files shipped in the package.

FastAPI's own pages load both from a CDN, so on a machine without internet (GPU clusters
often have none) they are blank. Here the app turns those off (``docs_url=None,
redoc_url=None``) and :func:`install` serves the same pages with every script, style and
icon from ``/docs/assets``: the vendored files in ``static/``, listed with their npm
package, version, integrity and SHA-256 in ``static/manifest.json``. Each page carries a
Content-Security-Policy that lets the browser fetch from this origin only, so what a
library would fetch from elsewhere (ReDoc's footer logo) is never asked for.

    python -m api.openapi_ui verify            # the files are what the manifest says
    python -m api.openapi_ui refresh [NAME@VERSION ...]   # fetch again with `npm pack`
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["ASSETS_URL", "STATIC", "install"]

STATIC = Path(__file__).resolve().parent / "static"
ASSETS_URL = "/docs/assets"
# No request may leave the host: Swagger UI's validator badge asks validator.swagger.io.
SWAGGER_UI_PARAMETERS = {"validatorUrl": None}
# ReDoc styles itself inline (styled-components) and runs its search in a blob: worker.
POLICY = (
    "default-src 'self'; script-src 'self' {scripts}; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


def same_origin_only(page: HTMLResponse) -> HTMLResponse:
    """``page`` with a policy that allows this origin and the page's own inline scripts
    (by their SHA-256), nothing else."""
    hashes = [
        "'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"
        for script in _INLINE_SCRIPT.findall(bytes(page.body).decode())
    ]
    page.headers["Content-Security-Policy"] = POLICY.format(scripts=" ".join(hashes)).replace(
        "'self' ;", "'self';"
    )
    return page


def install(app: FastAPI) -> None:
    """Serve ``/docs``, ``/redoc`` and their assets. Call it before any catch-all route."""
    openapi_url = app.openapi_url or "/openapi.json"
    title = f"{app.title} {app.version}"
    favicon = f"{ASSETS_URL}/swagger-ui/favicon-32x32.png"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        """The interactive OpenAPI page, offline."""
        page = get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{title} - Swagger UI",
            swagger_js_url=f"{ASSETS_URL}/swagger-ui/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui/swagger-ui.css",
            swagger_favicon_url=favicon,
            oauth2_redirect_url=None,
            swagger_ui_parameters=SWAGGER_UI_PARAMETERS,
        )
        return same_origin_only(page)

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        """The OpenAPI reference page, offline (no web fonts)."""
        page = get_redoc_html(
            openapi_url=openapi_url,
            title=f"{title} - ReDoc",
            redoc_js_url=f"{ASSETS_URL}/redoc/redoc.standalone.js",
            redoc_favicon_url=favicon,
            with_google_fonts=False,
        )
        return same_origin_only(page)

    app.mount(ASSETS_URL, StaticFiles(directory=STATIC), name="openapi-ui-assets")
