"""``/docs`` and ``/redoc`` work with the network cut: Chromium opens each page on the real
service with every request routed through the test, which refuses any that would leave
127.0.0.1 and records it; then the page must show every operation of the OpenAPI schema.

ReDoc's footer always shows Redocly's logo from its CDN; the page's Content-Security-Policy
stops the browser before it asks (a request that never leaves), and that refusal is the
only one allowed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Request, Route

from api.openapi_ui import STATIC
from tests.api.conftest import service_over_sqlite
from tests.services import ServerThread

LOCAL_SCHEMES = ("data", "blob", "about")
REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
# Chromium's wording has changed across releases: "Refused to load the image 'URL' because
# it violates ..." and "Loading the image 'URL' violates ...".
REFUSED = re.compile(r"(?:Refused to load|Loading) the \w+ '([^']+)' (?:because it )?violates")


@pytest.fixture(scope="module")
def docs_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    with service_over_sqlite(tmp_path_factory.mktemp("api-docs")) as (server, _token):
        yield server


class Offline:
    """A page whose requests outside 127.0.0.1 are refused, counted and named."""

    def __init__(self, browser: Browser) -> None:
        self.context = browser.new_context(viewport={"width": 1280, "height": 800})
        self.left: list[str] = []
        self.failed: list[str] = []
        self.errors: list[str] = []
        self.seen: list[str] = []
        self.refused: list[str] = []  # by the page's own policy: never sent
        self.context.route("**/*", self._route)
        self.page: Page = self.context.new_page()
        self.page.set_default_timeout(20_000)
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda error: self.errors.append(f"uncaught: {error}"))
        self.page.on("requestfailed", self._failed)

    def _route(self, route: Route) -> None:
        url = route.request.url
        self.seen.append(url)
        if urlsplit(url).hostname == "127.0.0.1":
            route.continue_()
        else:
            self.left.append(url)
            route.abort("internetdisconnected")

    def _failed(self, request: Request) -> None:
        if request.failure == "csp":  # stopped in the browser by the page's policy
            self.refused.append(request.url)
        elif urlsplit(request.url).scheme not in LOCAL_SCHEMES:
            self.failed.append(f"{request.url}: {request.failure}")

    def _console(self, message: ConsoleMessage) -> None:
        if message.type != "error":
            return
        if refused := REFUSED.match(message.text):
            self.refused.append(refused.group(1))
        else:
            self.errors.append(f"console: {message.text}")

    def check(self) -> None:
        assert self.left == [], f"requests that would leave the host: {self.left}"
        assert self.failed == [], f"failed requests: {self.failed}"
        assert self.errors == [], f"errors in the browser: {self.errors}"
        assert set(self.refused) <= {REDOC_LOGO}, f"refused by the policy: {self.refused}"


@pytest.fixture
def offline(browser: Browser) -> Iterator[Offline]:
    watched = Offline(browser)
    try:
        yield watched
    finally:
        watched.context.close()


def operations(server: ServerThread) -> list[tuple[str, str]]:
    schema = httpx.get(f"{server.url}/openapi.json").json()
    return [
        (method.upper(), path)
        for path, methods in schema["paths"].items()
        for method in methods
        if method in {"get", "post", "put", "patch", "delete"}
    ]


@pytest.mark.slow
def test_swagger_ui_renders_every_operation_offline(
    offline: Offline, docs_service: ServerThread
) -> None:
    expected = operations(docs_service)
    assert len(expected) >= 10
    page = offline.page
    page.goto(f"{docs_service.url}/docs")
    page.locator(".opblock").first.wait_for()
    page.wait_for_load_state("networkidle")
    shown = {
        (block.locator(".opblock-summary-method").inner_text().strip(), path)
        for block in page.locator(".opblock").all()
        if (path := block.locator(".opblock-summary-path").get_attribute("data-path"))
    }
    assert shown == set(expected)
    assert page.locator(".info .title").inner_text().startswith("microbatch-tuner")
    # The page's own assets were asked for, and from this host.
    assert any(url.endswith("/docs/assets/swagger-ui/swagger-ui-bundle.js") for url in offline.seen)
    offline.check()


def test_redoc_renders_every_operation_offline(
    offline: Offline, docs_service: ServerThread
) -> None:
    expected = operations(docs_service)
    page = offline.page
    page.goto(f"{docs_service.url}/redoc")
    page.locator("[data-section-id^='operation/']").first.wait_for()
    page.wait_for_load_state("networkidle")
    sections = page.locator("[data-section-id^='operation/']")
    assert sections.count() == len(expected)
    # Each operation's method and path, as ReDoc prints them in its right-hand panel.
    text = page.locator(".api-content").inner_text()
    for _method, path in expected:
        assert path in text, path
    assert any(url.endswith("/docs/assets/redoc/redoc.standalone.js") for url in offline.seen)
    offline.check()
    assert REDOC_LOGO not in offline.seen


def test_the_pages_name_no_other_host(docs_service: ServerThread) -> None:
    for path in ("/docs", "/redoc"):
        html = httpx.get(docs_service.url + path).text
        assert "http://" not in html, html
        assert "https://" not in html, html
        assert "/docs/assets/" in html


def test_the_assets_ship_in_the_package_and_match_their_manifest() -> None:
    from api.dashboard.vendor import verify

    assert verify(STATIC) == []
    for name in ("swagger-ui/swagger-ui-bundle.js", "redoc/redoc.standalone.js"):
        assert (STATIC / name).stat().st_size > 500_000
    assert Path(STATIC / "manifest.json").is_file()
