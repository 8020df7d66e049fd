"""The profile list: empty state, filters, sorting and pages in a real browser, the same rows
as the JSON API, a fixed number of statements per page, and 1,000 profiles usable within a
second."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from playwright.sync_api import Page
from sqlalchemy import event

from api.db import Database
from tests.dashboard.conftest import ROOT, Tab, signed_in
from tests.dashboard.data import fleet, store
from tests.services import ServerThread


def shown_ids(page: Page) -> list[int]:
    return [
        int(i)
        for i in page.locator("#profiles-table tbody tr").evaluate_all(
            "rows => rows.map(r => r.dataset.profileId)"
        )
    ]


def mstar_values(page: Page) -> list[int]:
    return [
        int(v)
        for v in page.locator("td.mstar").evaluate_all("els => els.map(e => e.dataset.value)")
    ]


def settle(page: Page, url_pattern: str) -> None:
    """Wait for an htmx swap to land: the address updated, no request in flight, and the
    new content settled. htmx wires the swapped-in form's listeners only when it settles
    (20 ms after the swap, when it takes ``htmx-added`` off): a change made before that
    is lost, and the next wait for the address times out (seen once in CI)."""
    page.wait_for_url(re.compile(url_pattern))
    busy = ".htmx-request, .htmx-swapping, .htmx-settling, .htmx-added"
    page.wait_for_function(f"() => !document.querySelector('{busy}')")


def api_ids(service: ServerThread, token: str, **params: Any) -> list[int]:
    with httpx.Client(base_url=service.url, timeout=10) as client:
        body = client.get(
            "/api/v1/profiles", params=params, headers={"Authorization": f"Bearer {token}"}
        ).json()
    return [row["id"] for row in body["data"]]


def test_an_empty_store_says_what_to_run(tab: Tab, reader: str, service: ServerThread) -> None:
    page = signed_in(tab, reader).open("/profiles")
    empty = page.locator("#empty-profiles")
    assert "No profiles yet" in empty.inner_text()
    assert "tuner profile examples.gpt:workload" in empty.inner_text()
    assert f"TUNER_URL={service.url}" in empty.inner_text()
    tab.screenshot("profiles-empty")
    for path, marker in (("/workloads", "#empty-profiles"), ("/jobs", "#empty-jobs")):
        assert tab.open(path).locator(marker).count() == 1


@pytest.mark.slow
def test_filters_sorting_and_pages_work_and_agree_with_the_api(
    tab: Tab, database: Database, reader: str, service: ServerThread
) -> None:
    store(database, fleet(60, workloads=3, devices=2))
    page = signed_in(tab, reader).open("/profiles?size=25")
    assert shown_ids(page) == api_ids(service, reader, limit=25)
    assert page.locator("#result-count").inner_text() == "1–25 of 60 profiles"
    tab.screenshot("profiles")

    # Pages: next, then the last one, each a new address that can be shared.
    page.click("a[data-page=next]")
    settle(page, r"page=2")
    assert len(shown_ids(page)) == 25
    assert page.locator("#result-count").inner_text() == "26–50 of 60 profiles"
    page.click("a[data-page='3']")
    settle(page, r"page=3")
    assert len(shown_ids(page)) == 10
    assert page.locator(".pager .current").inner_text() == "3"

    # A filter starts again at page 1 and shows exactly what the API lists.
    page.select_option("#filter-workload", label="model-01")
    settle(page, r"workload=\d+")
    assert "page=" not in page.url
    assert shown_ids(page) == api_ids(service, reader, workload="model-01", limit=25)
    assert page.locator("#result-count").inner_text() == "1–20 of 20 profiles"
    page.focus("#filter-device")
    page.select_option("#filter-device", label="device-01 · 768 MiB")  # named with its memory
    settle(page, r"device=\d+")
    expected = api_ids(service, reader, workload="model-01", device="device-01", limit=25)
    assert shown_ids(page) == expected
    assert len(expected) == 10
    assert page.locator("#filter-device").evaluate("el => el === document.activeElement")

    # Newest per workload and device: one row, the newest; the others are superseded.
    page.check("#filter-latest")
    settle(page, r"latest=1")
    assert shown_ids(page) == expected[:1]
    assert page.locator("[data-status]").first.get_attribute("data-status") != "superseded"
    page.uncheck("#filter-latest")
    settle(page, r"^(?!.*latest=)")
    statuses = page.locator("#profiles-table [data-status]").evaluate_all(
        "els => els.map(e => e.dataset.status)"
    )
    assert statuses[1:] == ["superseded"] * (len(expected) - 1)

    # Sorting by M*: descending first, then ascending; ties newest first.
    page.click("th a[data-sort=mstar]")
    settle(page, r"sort=mstar")
    values = mstar_values(page)
    assert values == sorted(values, reverse=True)
    assert page.locator("th[aria-sort]").get_attribute("aria-sort") == "descending"
    page.click("th a[data-sort=mstar]")
    settle(page, r"order=asc")
    values = mstar_values(page)
    assert values == sorted(values)

    # The address holds the whole view: a reload shows the same rows.
    before = shown_ids(page)
    page.reload()
    assert shown_ids(page) == before
    page.go_back()
    settle(page, r"^(?!.*order=asc)")
    assert "sort=mstar" in page.url
    tab.check()


def test_a_filter_that_matches_nothing_says_so(tab: Tab, database: Database, reader: str) -> None:
    store(database, fleet(3, workloads=2, devices=2))  # model-01 never ran on device-01
    page = signed_in(tab, reader).open("/profiles?workload=2&device=2")
    assert "No profile matches these filters" in page.locator("#results").inner_text()
    page.click("#results .empty a")
    settle(page, r"/profiles$")
    assert len(shown_ids(page)) == 3


def test_bad_list_parameters_are_explained(tab: Tab, database: Database, reader: str) -> None:
    tab.allow(r"status of 422")
    page = signed_in(tab, reader).open("/profiles?sort=colour")
    assert "sort by one of created, mstar" in page.locator("#page-error").inner_text()


@contextmanager
def statements(service: ServerThread) -> Iterator[list[str]]:
    """The SQL statements the service runs inside the block (it runs in this process)."""
    app = service.server.config.app
    assert isinstance(app, FastAPI)
    engine = app.state.db.engine
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if not statement.startswith(("BEGIN", "PRAGMA")):  # SQLite's own transaction control
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def test_a_page_costs_the_same_statements_whatever_its_size(
    database: Database, reader: str, service: ServerThread
) -> None:
    store(database, fleet(300))
    headers = {"Authorization": f"Bearer {reader}"}
    with httpx.Client(base_url=service.url, headers=headers, timeout=30) as client:
        client.get("/")  # records the token's first use, a write that happens once a minute
        counts = {}
        for size in (25, 200):
            for sort in ("created", "headroom"):
                with statements(service) as seen:
                    response = client.get("/profiles", params={"size": size, "sort": sort})
                assert response.status_code == 200
                assert response.text.count("data-profile-id=") == size
                counts[size, sort] = len(seen)
    assert counts[25, "created"] == counts[200, "created"]
    assert counts[25, "headroom"] == counts[200, "headroom"]
    # The token, the page of rows, their count, the two filter menus, the variant options
    # the workload menu names, and the evidence tuner.answer.current decides each row's
    # status from (the page's profiles' heads, OOM reports and probes).
    assert counts[200, "created"] <= 9, counts


@pytest.mark.slow
def test_a_thousand_profiles_list_is_interactive_within_a_second(
    tab: Tab, database: Database, reader: str, db_label: str
) -> None:
    store(database, fleet(1000))
    signed_in(tab, reader)
    tab.open("/login")  # the browser and the connection are warm; the list page is not
    started = time.perf_counter()
    page = tab.open("/profiles")
    page.wait_for_function("() => document.documentElement.dataset.ready !== undefined")
    wall_ms = (time.perf_counter() - started) * 1000
    timing = page.evaluate(
        """() => {
          const nav = performance.getEntriesByType('navigation')[0];
          return {response_end: nav.responseEnd, dom_content_loaded: nav.domContentLoadedEventEnd,
                  ready: Number(document.documentElement.dataset.ready), load: nav.loadEventEnd};
        }"""
    )
    assert page.locator("#result-count").inner_text() == "1–50 of 1,000 profiles"
    assert timing["dom_content_loaded"] < 1000, timing
    assert timing["ready"] < 1000, timing

    # Usable, not only loaded: the next page arrives within the same budget.
    started = time.perf_counter()
    page.click("a[data-page=next]")
    settle(page, r"page=2")
    next_page_ms = (time.perf_counter() - started) * 1000
    assert page.locator("#result-count").inner_text() == "51–100 of 1,000 profiles"
    assert next_page_ms < 1000
    started = time.perf_counter()
    page.select_option("#filter-workload", label="model-03")
    settle(page, r"workload=")
    filter_ms = (time.perf_counter() - started) * 1000
    assert page.locator("#result-count").inner_text() == "1–50 of 100 profiles"
    assert filter_ms < 1000

    timings = ROOT / "test-artifacts" / f"dashboard-list-1000-{db_label}.json"
    timings.parent.mkdir(exist_ok=True)
    timings.write_text(
        json.dumps(
            {
                **{k: round(v, 1) for k, v in timing.items()},
                "wall_ms": round(wall_ms, 1),
                "next_page_ms": round(next_page_ms, 1),
                "filter_ms": round(filter_ms, 1),
            },
            indent=2,
        )
    )
    tab.screenshot("profiles-1000")


def test_a_failed_update_is_shown_not_swallowed(tab: Tab, database: Database, reader: str) -> None:
    store(database, fleet(60))
    tab.allow(r"status of 503|Response Status Error Code 503")  # Chromium's and htmx's logs
    page = signed_in(tab, reader).open("/profiles")
    page.route(
        "**/profiles?page=2*",
        lambda route: route.fulfill(
            status=503,
            content_type="text/html",
            body='<p class="error-box">the database is not answering</p>',
        ),
    )
    page.click("a[data-page=next]")
    banner = page.locator("#request-error")
    banner.wait_for()
    assert banner.inner_text() == (
        "The page could not be updated: 503 Service Unavailable: the database is not answering"
    )
    assert len(shown_ids(page)) == 50  # the page it was on stays
