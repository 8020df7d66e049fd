"""A page on another origin, in a browser signed in to the dashboard, cannot write: the
API takes the dashboard's cookie for reads only, and writes need the bearer header that
a page on another origin cannot send without the service's consent (it gives none)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from playwright.sync_api import Browser

from api.db import Database
from tests.api.conftest import make_token
from tests.api.jobs_helpers import api_client, get_job, queue, register
from tests.services import ServerThread

ATTACK = """<!doctype html><title>waiting</title><script>
fetch("{service}/api/v1/workers/{worker}/claim", {{
  method: "POST", mode: "no-cors", credentials: "include"
}}).then(() => {{ document.title = "sent"; }}, (error) => {{ document.title = "failed"; }});
</script>"""


@pytest.fixture
def another_origin() -> Iterator[tuple[ServerThread, dict[str, str]]]:
    """A second local server (another port: another origin, the same site) serving the
    page given in ``pages``."""
    app = FastAPI()
    pages: dict[str, str] = {}

    @app.get("/")
    def page() -> HTMLResponse:
        return HTMLResponse(pages["attack"])

    with ServerThread(app) as server:
        yield server, pages


def test_a_write_from_another_origin_with_the_cookie_changes_nothing(
    browser: Browser, service: ServerThread, database: Database, another_origin
) -> None:
    admin = make_token(database, "admin", name="admin")
    with api_client(service, admin) as client:
        worker = register(client)
        job = queue(client)
    server, pages = another_origin
    pages["attack"] = ATTACK.format(service=service.url, worker=worker)
    context = browser.new_context()
    try:
        # Signed in to the dashboard with a token that may claim jobs.
        context.add_cookies(
            [
                {
                    "name": "tuner_token",
                    "value": admin,
                    "url": service.url,
                    "httpOnly": True,
                    "secure": True,
                    "sameSite": "Strict",
                }
            ]
        )
        page = context.new_page()
        with page.expect_response(lambda r: "/claim" in r.url) as sent:
            page.goto(server.url)
        page.wait_for_function("document.title === 'sent'")
        assert sent.value.status == 401  # the cookie rode along; it no longer writes
        # The same cookie still reads, in the dashboard's own pages.
        assert context.request.get(f"{service.url}/api/v1/jobs/{job['id']}").status == 200
    finally:
        context.close()
    with api_client(service, admin) as client:
        assert get_job(client, job["id"])["status"] == "queued"
