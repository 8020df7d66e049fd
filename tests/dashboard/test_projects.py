"""The dashboard in Chromium shows the signed-in token's project, and only its rows; a
token of every project switches project from the header, and one of a single project
cannot. On SQLite and PostgreSQL."""

from __future__ import annotations

from api.db import Database
from api.store.tokens import create_token
from tests.api.documents import sample_profile
from tests.dashboard.conftest import Tab, signed_in
from tests.dashboard.data import store


def _token(database: Database, *, project: str | None) -> str:
    with database.session(write=True) as session:
        _, plain = create_token(session, name="root", scopes=["admin"], project=project)
    return plain


def test_a_token_sees_its_project_and_an_admin_of_every_project_switches(
    tab: Tab, database: Database
) -> None:
    store(database, [sample_profile(workload_key="a" * 24, workload_name="team-a-model")])
    store(
        database,
        [sample_profile(workload_key="a" * 24, workload_name="team-b-model")],
        project="team-b",
    )
    team_b = _token(database, project="team-b")
    page = signed_in(tab, team_b).open("/profiles")
    assert page.locator("#project-name").inner_text() == "team-b"
    assert page.locator("text=team-b-model").count() > 0
    assert page.locator("text=team-a-model").count() == 0
    assert page.locator(".project-switch").count() == 0  # one project's token: no switch

    page.context.clear_cookies()
    page = signed_in(tab, _token(database, project=None)).open("/profiles")
    assert page.locator("#project-name").input_value() == "default"
    assert page.locator("text=team-a-model").count() > 0
    page.fill("#project-name", "team-b")
    page.click(".project-switch button")
    page.wait_for_url(tab.base_url + "/")
    page = tab.open("/profiles")
    assert page.locator("#project-name").input_value() == "team-b"
    assert page.locator("text=team-b-model").count() > 0
    assert page.locator("text=team-a-model").count() == 0
    tab.check()
