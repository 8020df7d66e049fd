"""The dashboard marks a fake world's profile (memory measured, speed not) everywhere it
shows it, in Chromium: the list, the profile's header and stats, the calculator (which
quotes no speed, as the API's answer does not) and the world-size chart."""

from __future__ import annotations

import httpx
import pytest

from api.db import Database
from tests.api.test_simulated_answers import fake_world
from tests.dashboard.conftest import Tab, signed_in
from tests.dashboard.data import store
from tests.services import ServerThread


@pytest.mark.slow
def test_the_dashboard_marks_a_fake_world_everywhere(
    tab: Tab, database: Database, reader: str, service: ServerThread
) -> None:
    (profile_id,) = store(database, [fake_world()])
    with httpx.Client(base_url=service.url, headers={"Authorization": f"Bearer {reader}"}) as http:
        answer = http.get(
            "/api/v1/recommendation",
            params={
                "workload": "gpt-test",
                "device": "cpu-test",
                "global_batch_size": 64,
                "world_size": 8,
                "parallel": "fsdp",
            },
        ).json()
    assert answer["profile_simulated_ranks"] is True
    assert answer["expected_samples_per_second"] is None

    page = signed_in(tab, reader).open("/profiles")
    row = page.locator(f"tr[data-profile-id='{profile_id}']")
    assert row.locator("[data-run=simulated]").count() == 1

    page = tab.open(f"/profiles/{profile_id}")
    assert page.locator("#run-badges [data-run=simulated]").count() == 1
    assert "not measured: simulated ranks" in page.locator("#throughput-stat").inner_text()
    assert page.locator("#throughput-chart").count() == 0
    assert page.locator("#calc-result [data-run=simulated]").count() == 1
    assert page.locator("[data-warning=simulated]").count() == 1
    assert "simulated ranks" in page.locator("#calc-speed").inner_text()
    tab.screenshot("profile-simulated")

    workload = page.locator("a[href^='/workloads/']").first.get_attribute("href")
    page = tab.open(str(workload))
    assert page.locator("#world-sizes [data-run=simulated]").count() >= 1
    tab.check()
