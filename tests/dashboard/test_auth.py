"""Access: the same tokens as the API, kept in a secure http-only cookie by the login form;
open to everyone when the service runs with public reads; never a write without a write
token."""

from __future__ import annotations

import httpx
import pytest

from api.db import Database
from api.store.tokens import list_tokens, revoke_token
from tests.api.documents import sample_profile
from tests.dashboard.conftest import Tab, signed_in
from tests.dashboard.data import store
from tests.services import ServerThread

PAGES = ("/", "/profiles", "/workloads", "/jobs", "/profiles/1", "/workloads/1")


def test_pages_send_a_browser_to_login_while_the_api_answers_401(
    tab: Tab, service: ServerThread, database: Database
) -> None:
    store(database, [sample_profile()])
    for path in PAGES:
        tab.open(path)
        assert tab.page.url.startswith(f"{service.url}/login?next=")
        assert tab.page.locator("h1").inner_text() == "Sign in"
    with httpx.Client(base_url=service.url, timeout=10) as client:
        page = client.get("/")
        assert page.status_code == 303
        assert page.headers["location"] == "/login?next=%2F"
        api = client.get("/api/v1/profiles")
        assert api.status_code == 401
        assert api.json()["error"]["code"] == "unauthenticated"
    tab.screenshot("login")


def test_login_keeps_the_token_in_a_secure_http_only_cookie_and_returns_to_the_page(
    tab: Tab, service: ServerThread, database: Database, reader: str
) -> None:
    store(database, [sample_profile()])
    page = tab.open("/profiles/1")
    assert "/login?next=%2Fprofiles%2F1" in page.url
    page.fill("#token", reader)
    page.click("#login-form button[type=submit]")
    page.wait_for_url(f"{service.url}/profiles/1")
    page.wait_for_selector("#memory-chart[data-drawn]")  # the API accepted the cookie too
    (cookie,) = page.context.cookies()
    assert cookie["name"] == "tuner_token"
    assert cookie["value"] == reader
    assert cookie["httpOnly"] is True
    assert cookie["secure"] is True
    assert cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/"
    assert page.evaluate("document.cookie") == ""  # out of reach of any script
    assert page.locator(".who-name").inner_text().startswith("ada")


def test_a_wrong_token_is_refused_with_the_reason(tab: Tab) -> None:
    tab.allow(r"status of 401")  # the browser logs the refused form post itself
    page = tab.open("/login")
    for token, reason in (
        ("not-a-token", "does not look like a microbatch-tuner token"),
        ("mbt_" + "x" * 43, "unknown token"),
    ):
        page.fill("#token", token)
        with page.expect_response(lambda r: r.url.endswith("/login")) as answer:
            page.click("#login-form button[type=submit]")
        assert answer.value.status == 401
        assert reason in page.locator("#login-error").inner_text()
    assert page.context.cookies() == []


def test_a_revoked_token_ends_the_session_at_the_next_page(
    tab: Tab, database: Database, reader: str
) -> None:
    signed_in(tab, reader)
    tab.open("/profiles")
    assert tab.page.locator("h1").inner_text() == "Profiles"
    with database.session(write=True) as session:
        (token_id,) = [token.id for token in list_tokens(session)]
        revoke_token(session, token_id)
    page = tab.open("/jobs")
    assert "/login?" in page.url
    assert "no longer accepted" in page.locator(".notice").inner_text()
    assert page.context.cookies() == []  # the dead cookie is cleared


def test_sign_out_forgets_the_cookie(tab: Tab, reader: str) -> None:
    signed_in(tab, reader)
    page = tab.open("/workloads")
    page.click("text=Sign out")
    page.wait_for_url("**/login")
    assert page.context.cookies() == []
    tab.open("/workloads")
    assert "/login?" in tab.page.url


def test_login_never_redirects_to_another_site(
    tab: Tab, service: ServerThread, reader: str
) -> None:
    page = tab.open("/login?next=//evil.example/steal")
    page.fill("#token", reader)
    page.click("#login-form button[type=submit]")
    page.wait_for_url(f"{service.url}/")


def test_a_login_posted_from_another_site_is_refused(service: ServerThread, reader: str) -> None:
    with httpx.Client(base_url=service.url, timeout=10) as client:
        response = client.post(
            "/login",
            content=f"token={reader}&next=/",
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "Origin": "https://evil.example",
            },
        )
    assert response.status_code == 403
    assert "set-cookie" not in response.headers


def test_public_reads_open_every_page_without_a_token(
    public_tab: Tab, public_service: ServerThread, database: Database
) -> None:
    store(database, [sample_profile()])
    for path in PAGES:
        page = public_tab.open(path)
        assert page.url == public_service.url + path
        assert page.locator(".who-name").inner_text() == "Public, read-only"
    public_tab.open("/profiles/1").wait_for_selector("#memory-chart[data-drawn]")
    public_tab.page.wait_for_selector("#calc-answer[data-state=done]")


@pytest.mark.slow
@pytest.mark.parametrize("signed", ["read token", "public"])
def test_the_dashboard_offers_no_write_and_a_read_token_cannot_write(
    signed: str, request: pytest.FixtureRequest, database: Database, reader: str
) -> None:
    store(database, [sample_profile()])
    if signed == "read token":
        browsing = signed_in(request.getfixturevalue("tab"), reader)
    else:
        browsing = request.getfixturevalue("public_tab")
    browsing.allow(r"status of 401")  # the refused write below
    for path in PAGES:
        page = browsing.open(path)
        posting = page.locator("form[method=post]")
        actions = posting.evaluate_all("forms => forms.map(f => f.getAttribute('action'))")
        assert actions in ([], ["/logout"])
    # Even a hand-made request from the page, with the cookie, cannot write: writes never
    # take the cookie, whatever token it holds.
    status = browsing.page.evaluate(
        """async () => (await fetch('/api/v1/jobs', {
             method: 'POST', headers: {'Content-Type': 'application/json'},
             body: JSON.stringify({target: 'examples.gpt:workload', device: 'cpu-test'}),
           })).status"""
    )
    assert status == 401


def test_a_filter_change_after_revocation_moves_the_whole_page_to_login(
    tab: Tab, database: Database, reader: str
) -> None:
    store(database, [sample_profile()])
    page = signed_in(tab, reader).open("/profiles")
    with database.session(write=True) as session:
        (token_id,) = [token.id for token in list_tokens(session)]
        revoke_token(session, token_id)
    page.select_option("#filter-workload", label="gpt-test")
    page.wait_for_url("**/login?**")
    assert "no longer accepted" in page.locator(".notice").inner_text()


def test_a_dead_cookie_on_a_public_service_is_cleared_and_reading_goes_on(
    public_tab: Tab, public_service: ServerThread
) -> None:
    # The API would refuse the dead cookie (401) even with public reads, so the charts
    # could not load: the page asks to sign in again, or to go on without a token.
    signed_in(public_tab, "mbt_" + "0" * 43)
    page = public_tab.open("/workloads")
    assert "/login?" in page.url
    assert page.context.cookies() == []
    page.click("text=continue without signing in")
    page.wait_for_url(f"{public_service.url}/workloads")
    assert page.locator(".who-name").inner_text() == "Public, read-only"
