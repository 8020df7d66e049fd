"""Browser tests of the dashboard: Debian's Chromium, driven by Playwright, against the real
service under uvicorn, over SQLite and PostgreSQL (the API fixtures, parametrized).

Chromium starts once per session. Where /usr/bin/chromium is missing the browser tests
skip, except under ``CI=true``, where they fail: CI must run them (``.ci/run`` installs it).
Every page a test opens is watched: a console error, a failed script or a refused
Content-Security-Policy fails the test. Screenshots go to test-artifacts/screenshots/.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright

from api.config import ServiceSettings
from api.db import Database
from api.main import create_app
from tests.api import conftest as api_fixtures
from tests.api.conftest import make_token
from tests.services import ServerThread

# The API's fixtures, shared: a fresh database of each kind, and the service over it.
postgres_server = api_fixtures.postgres_server
sqlite_url = api_fixtures.sqlite_url
postgres_url = api_fixtures.postgres_url
database_url = api_fixtures.database_url
migrated_url = api_fixtures.migrated_url
database = api_fixtures.database
service = api_fixtures.service

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
VIEWPORTS = {"desktop": (1280, 800), "phone": (390, 844)}


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        message = f"Chromium not found at {CHROMIUM} (apt-get install chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + ": CI must run the browser tests")
        pytest.skip(message)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


class Tab:
    """One browser tab on the service, with its console watched."""

    def __init__(self, page: Page, base_url: str, label: str) -> None:
        self.page = page
        self.base_url = base_url
        self.label = label
        self.errors: list[str] = []
        self._allowed: list[re.Pattern[str]] = []
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.errors.append(f"uncaught: {error}"))

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error" and not any(p.search(message.text) for p in self._allowed):
            self.errors.append(f"console: {message.text} ({message.location.get('url')})")

    def allow(self, pattern: str) -> None:
        """An error this test provokes on purpose (the API refusing bad input, say)."""
        self._allowed.append(re.compile(pattern))

    def open(self, path: str) -> Page:
        response = self.page.goto(self.base_url + path)
        assert response is not None
        self.page.wait_for_load_state("load")
        self.check()
        return self.page

    def check(self) -> None:
        assert not self.errors, "errors in the browser:\n" + "\n".join(self.errors)

    def screenshot(self, name: str) -> None:
        """Save the page at 1280×800 and at 390×844 (whole page), then restore desktop."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        self.page.evaluate("() => window.scrollTo(0, 0)")  # the sticky bar stays on top
        for width, height in VIEWPORTS.values():
            self.page.set_viewport_size({"width": width, "height": height})
            # Charts follow their container's width on the next frame.
            self.page.evaluate("() => new Promise(r => requestAnimationFrame(() => r(null)))")
            self.page.wait_for_timeout(100)
            path = SCREENSHOTS / f"{name}-{self.label}-{width}x{height}.png"
            self.page.screenshot(path=str(path), full_page=True)
        self.page.set_viewport_size({"width": 1280, "height": 800})
        self.check()


def signed_in(tab: Tab, token: str) -> Tab:
    """Put the token in the cookie the login form sets, without going through the form."""
    tab.page.context.add_cookies(
        [
            {
                "name": "tuner_token",
                "value": token,
                "url": tab.base_url,
                "httpOnly": True,
                "secure": True,
                "sameSite": "Strict",
            }
        ]
    )
    return tab


@contextmanager
def open_tab(
    browser: Browser, url: str, label: str, size: tuple[int, int] = (1280, 800)
) -> Iterator[Tab]:
    """A fresh browser context (no cookies) of ``size`` on the service at ``url``; its
    console is checked on the way out."""
    context = browser.new_context(viewport={"width": size[0], "height": size[1]})
    page = context.new_page()
    page.set_default_timeout(10_000)
    tab = Tab(page, url, label)
    try:
        yield tab
        tab.check()
    finally:
        context.close()


def _tab(browser: Browser, server: ServerThread, label: str) -> Iterator[Tab]:
    with open_tab(browser, server.url, label) as tab:
        yield tab


@pytest.fixture
def db_label(database_url: str) -> str:
    return "postgres" if database_url.startswith("postgresql") else "sqlite"


@pytest.fixture
def tab(browser: Browser, service: ServerThread, db_label: str) -> Iterator[Tab]:
    """A fresh browser context (no cookies) on the service; reads need a token."""
    yield from _tab(browser, service, db_label)


@pytest.fixture
def reader(database: Database) -> str:
    return make_token(database, "read", name="ada")


@pytest.fixture
def writer(database: Database) -> str:
    return make_token(database, "write", name="writer")


@pytest.fixture
def public_service(migrated_url: str) -> Iterator[ServerThread]:
    """The service started with public reads."""
    app = create_app(ServiceSettings(database_url=migrated_url, public_reads=True))
    with ServerThread(app) as server:
        yield server


@pytest.fixture
def public_tab(browser: Browser, public_service: ServerThread, db_label: str) -> Iterator[Tab]:
    yield from _tab(browser, public_service, db_label)
