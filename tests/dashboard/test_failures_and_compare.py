"""The failures page, two profiles compared, the calculator's "copy as tuner recommend"
and the lists' downloads, in Chromium at desktop and phone size, over SQLite (and the
failures' order, filters and pages over PostgreSQL too).

One store per database kind for the module: a 40 GiB A100 profile measured 40 days ago and
the same workload on an 80 GiB H100 (both searches ran out of memory at 60 and 64), a
workload whose probe failed three days ago, an out-of-memory report from training, a job
that failed, one retried, a worker gone silent and one that left on purpose; and a profile
of another project.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page
from sqlalchemy import select, update

from api import migrate, models
from api.config import ServiceSettings
from api.dashboard import failures, queries
from api.db import Database
from api.main import create_app
from api.store.tokens import create_token
from tests.api.conftest import fresh_postgres_database, make_token
from tests.api.documents import sample_probe, sample_profile
from tests.dashboard.conftest import Tab, signed_in
from tests.dashboard.data import GiB, api, claim, cuda_profile, fail, queue_job, register_worker
from tests.dashboard.data import store as store_profiles
from tests.services import ServerThread
from tuner.core.results import ProbeResult
from tuner.core.wire.recommendation import RecommendationPublic, recommend_command

VIEWPORTS = {"desktop": (1280, 800), "phone": (390, 844)}
ROOT = Path(__file__).resolve().parents[2]
PROBE_ERROR = "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)"
OOM_MESSAGE = "CUDA out of memory. Tried to allocate 2.00 GiB"


@dataclass(frozen=True)
class Store:
    url: str
    database_url: str
    token: str
    label: str
    ids: dict[str, int]  # profiles: a100, h100, broken, other (another project's)
    devices: dict[str, int]  # a100, h100
    workloads: dict[str, int]  # llama, broken
    jobs: dict[str, int]  # failed, retried
    workers: dict[str, int]  # silent, left, busy


def _profiles() -> dict[str, Any]:
    now = models.utcnow()
    a100 = cuda_profile(created_at=now - timedelta(days=40))
    h100 = cuda_profile(created_at=now - timedelta(days=39), device_name="NVIDIA H100 80GB")
    h100 = h100.model_copy(
        update={
            "device_key": "h100".ljust(24, "z"),
            "device": h100.device.model_copy(update={"capacity_bytes": 80 * GiB}),
            "max_micro_batch_size": 48,
        }
    )
    broken = sample_profile(
        max_micro_batch_size=1,
        workload_key="b" * 24,
        workload_name="broken-model",
        created_at=now - timedelta(days=3),
    )
    failed = ProbeResult(micro_batch_size=2, fits=False, error=PROBE_ERROR, steps_run=0)
    # Its own target: jobs are a workload's by the target they run.
    info = broken.workload.model_copy(update={"target": "examples.broken:workload"})
    broken = broken.model_copy(
        update={"workload": info, "probes": [sample_probe(1, fits=True), failed]}
    )
    return {"a100": a100, "h100": h100, "broken": broken}


def _store(url: str, label: str) -> Generator[Store, None, None]:
    migrate.upgrade(url)
    database = Database(url)
    token = make_token(database, "admin", name="ada")
    worker_token = make_token(database, "worker", name="worker")
    profiles = _profiles()
    ids = dict(zip(profiles, store_profiles(database, list(profiles.values())), strict=True))
    (ids["other"],) = store_profiles(database, [sample_profile()], project="other")
    with database.session() as session:
        devices = {
            name: session.get_one(models.Profile, ids[name]).device_id for name in ("a100", "h100")
        }
        workloads = {
            name: session.get_one(models.Profile, ids[key]).workload_id
            for name, key in (("llama", "a100"), ("broken", "broken"))
        }
    database.dispose()
    with ServerThread(create_app(ServiceSettings(database_url=url))) as server:
        with api(server.url, token) as people, api(server.url, worker_token) as workers:
            report = people.post(
                "/api/v1/oom-reports",
                json={
                    "workload": profiles["a100"].workload_key,
                    "device": profiles["a100"].device_key,
                    "micro_batch_size": 40,
                    "settled_micro_batch_size": 30,
                    "message": OOM_MESSAGE,
                },
            )
            assert report.status_code == 201, report.text
            busy = register_worker(workers, "gpu-host-1", "NVIDIA L4")
            silent = register_worker(workers, "gpu-host-2", "NVIDIA L4")
            left = register_worker(workers, "gpu-host-3", "NVIDIA L4")
            failed_job = queue_job(people, "NVIDIA L4", layers=8)
            fail(workers, claim(workers, busy["id"]), "ModuleNotFoundError: No module named 'x'")
            retried_job = queue_job(people, "NVIDIA L4", layers=4)
            first = claim(workers, busy["id"])
            response = workers.post(
                f"/api/v1/jobs/{first['job']['id']}/failure",
                json={
                    "lease_id": first["lease"]["lease_id"],
                    "reason": "the machine rebooted",
                    "retryable": True,
                },
            )
            assert response.status_code == 200, response.text
            again = claim(workers, busy["id"])
            assert again["job"]["attempts"] == 2
            assert workers.post(f"/api/v1/workers/{left['id']}/leave").status_code == 200
        database = Database(url)
        with database.session(write=True) as session:
            # Both last heard from ten minutes ago: one left on purpose, one went silent.
            session.execute(
                update(models.Worker)
                .where(models.Worker.id.in_([silent["id"], left["id"]]))
                .values(last_heartbeat_at=models.utcnow() - timedelta(minutes=10))
            )
        database.dispose()
        yield Store(
            server.url,
            url,
            token,
            label,
            ids,
            devices,
            workloads,
            {"failed": failed_job["id"], "retried": retried_job["id"]},
            {"silent": silent["id"], "left": left["id"], "busy": busy["id"]},
        )


# The pages read the store through one paged UNION ALL (api.dashboard.failures): the tests
# of its order, filters and pages run on PostgreSQL too; the rest of the pages on SQLite.
BOTH_STORES = pytest.mark.parametrize("failing", ["sqlite", "postgres"], indirect=True)


@pytest.fixture(scope="module")
def failing(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Store]:
    if getattr(request, "param", "sqlite") == "sqlite":
        path = tmp_path_factory.mktemp("failures") / "tuner.db"
        yield from _store(f"sqlite:///{path}", "sqlite")
    else:
        with fresh_postgres_database(request.getfixturevalue("postgres_server")) as url:
            yield from _store(url, "postgres")


@pytest.fixture(params=list(VIEWPORTS))
def tab(request: pytest.FixtureRequest, browser: Browser, failing: Store) -> Iterator[Tab]:
    width, height = VIEWPORTS[request.param]
    context = browser.new_context(viewport={"width": width, "height": height})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=failing.url)
    page = context.new_page()
    page.set_default_timeout(10_000)
    opened = Tab(page, failing.url, f"{failing.label}-{request.param}")
    try:
        yield signed_in(opened, failing.token)
        opened.check()
    finally:
        context.close()


def listed(page: Page) -> list[tuple[str, int]]:
    rows = page.locator("#failures-table tbody tr").evaluate_all(
        "rows => rows.map(r => [r.dataset.kind, Number(r.dataset.id)])"
    )
    return [(kind, row_id) for kind, row_id in rows]


def probe_ids(store: Store, profile: str, *, error: bool) -> set[int]:
    """The profile's probes that ran out of memory (or, with ``error``, that failed)."""
    database = Database(store.database_url)
    try:
        with database.session() as session:
            failed = models.Probe.error.is_not(None) if error else models.Probe.oom.is_(True)
            return set(
                session.scalars(
                    select(models.Probe.id).where(
                        models.Probe.profile_id == store.ids[profile], failed
                    )
                )
            )
    finally:
        database.dispose()


# Failures


@pytest.mark.slow
@BOTH_STORES
def test_the_failures_page_lists_each_kind_newest_first(tab: Tab, failing: Store) -> None:
    page = tab.open("/failures")
    rows = listed(page)
    kinds = {kind for kind, _ in rows}
    assert kinds == {
        "oom-report",
        "probe-oom",
        "probe-error",
        "job-failed",
        "job-retried",
        "worker-silent",
    }
    assert ("worker-silent", failing.workers["silent"]) in rows
    # A worker that said it stops is no failure; a busy one neither.
    assert ("worker-silent", failing.workers["left"]) not in rows
    assert ("worker-silent", failing.workers["busy"]) not in rows
    assert ("job-failed", failing.jobs["failed"]) in rows
    assert ("job-retried", failing.jobs["retried"]) in rows
    oom_probes = probe_ids(failing, "a100", error=False) | probe_ids(failing, "h100", error=False)
    assert {row_id for kind, row_id in rows if kind == "probe-oom"} == oom_probes
    assert len(oom_probes) == 4  # 60 and 64 on each GPU
    # Newest first: the times the rows carry never go up.
    times = page.locator("#failures-table tbody tr td:last-child time").evaluate_all(
        "ts => ts.map(t => t.getAttribute('datetime'))"
    )
    assert times == sorted(times, reverse=True)
    # The report links the profile it caps: the A100's, received before it.
    report = page.locator("tr[data-kind=oom-report]")
    assert OOM_MESSAGE in report.inner_text()
    assert report.locator("a[data-profile-link]").get_attribute("href") == (
        f"/profiles/{failing.ids['a100']}"
    )
    error = page.locator("tr[data-kind=probe-error]")
    assert PROBE_ERROR in error.inner_text()
    assert error.locator("a[data-profile-link]").get_attribute("href") == (
        f"/profiles/{failing.ids['broken']}"
    )
    assert "No module named 'x'" in page.locator("tr[data-kind=job-failed]").inner_text()
    assert "2/" in page.locator("tr[data-kind=job-retried]").inner_text()
    # Another project's failures are not this one's: its profile's probes never show.
    assert page.locator("#failure-count").inner_text().startswith(f"1–{len(rows)} of {len(rows)}")
    tab.screenshot("failures")


@pytest.mark.slow
@BOTH_STORES
def test_the_failures_filters_narrow_and_live_in_the_url(tab: Tab, failing: Store) -> None:
    page = tab.open("/failures")
    everything = listed(page)
    with page.expect_response(lambda r: "since=day" in r.url):
        page.select_option("#filter-since", "day")
    page.wait_for_url("**/failures?since=day")
    day = listed(page)
    # The probes were measured days ago; the report, the jobs and the silence are today's.
    assert {kind for kind, _ in day} == {"oom-report", "job-failed", "job-retried", "worker-silent"}
    page = tab.open("/failures?since=week")
    assert {kind for kind, _ in listed(page)} == {kind for kind, _ in day} | {"probe-error"}

    # By device: the H100's own out-of-memory probes, nothing of the A100's.
    page = tab.open(f"/failures?device={failing.devices['h100']}")
    assert page.locator("#filter-device").input_value() == str(failing.devices["h100"])
    h100 = listed(page)
    assert {row_id for _, row_id in h100} == probe_ids(failing, "h100", error=False)
    # By workload: its probe's error only (workers belong to no workload, the jobs ran
    # another target).
    page = tab.open(f"/failures?workload={failing.workloads['broken']}")
    assert [kind for kind, _ in listed(page)] == ["probe-error"]
    # By kind.
    page = tab.open("/failures?show=jobs")
    assert sorted(listed(page)) == [
        ("job-failed", failing.jobs["failed"]),
        ("job-retried", failing.jobs["retried"]),
    ]
    assert len(everything) > len(h100)
    # Nothing matches: said in words.
    page = tab.open(f"/failures?workload={failing.workloads['broken']}&since=day")
    assert (
        "Nothing went wrong that matches these filters"
        in page.locator("#empty-failures").inner_text()
    )
    # Bad input: one line saying what to do.
    tab.allow("422")
    response = page.goto(failing.url + "/failures?since=forever")
    assert response is not None
    assert response.status == 422
    assert "use one of day, week, month, all" in page.locator(".error-box").inner_text()


def test_another_projects_failures_are_not_listed(tab: Tab, failing: Store) -> None:
    database = Database(failing.database_url)
    with database.session(write=True) as session:
        _, other = create_token(session, name="team-b", scopes=["read"], project="other")
    database.dispose()
    tab.page.context.clear_cookies()
    page = signed_in(tab, other).open("/failures")
    assert page.locator("#project-name").inner_text() == "other"
    # Its one profile ran no probe out of memory: this project has nothing to show.
    assert page.locator("#failures-table").count() == 0
    assert "No failures" in page.locator("#empty-failures").inner_text()
    assert page.locator("#downloads").count() == 0
    with api(failing.url, other) as client:
        assert client.get("/failures.json").json() == {"data": [], "count": 0}


@BOTH_STORES
def test_the_failures_page_in_pages(
    tab: Tab, failing: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The service runs in this process: pages of 4 stand for the real 50.
    monkeypatch.setattr(failures, "PAGE_SIZE", 4)
    with api(failing.url, failing.token) as client:
        everything = [(r["kind"], r["id"]) for r in client.get("/failures.json").json()["data"]]
    assert len(everything) == 9
    page = tab.open("/failures?show=all")
    assert listed(page) == everything[:4]
    page.click("a[data-page=next]")
    page.wait_for_url("**/failures?page=2")
    assert listed(page) == everything[4:8]
    assert page.locator("#failure-count").inner_text().startswith("5–8 of 9")
    page = tab.open("/failures?page=3")
    assert listed(page) == everything[8:]
    page = tab.open("/failures?page=4")
    assert "past the end" in page.locator("#failures").inner_text()


@pytest.mark.slow
def test_every_page_links_the_failures(tab: Tab, failing: Store) -> None:
    for path in (
        "/",
        "/profiles",
        f"/profiles/{failing.ids['a100']}",
        "/workloads",
        "/devices",
        "/jobs",
        "/failures",
        f"/compare?a={failing.ids['a100']}&b={failing.ids['h100']}",
    ):
        page = tab.open(path)
        link = page.locator("nav.nav a[href='/failures']")
        assert link.count() == 1, path
    assert page.locator("nav.nav a[href='/failures']").get_attribute("aria-current") is None
    page = tab.open("/failures")
    assert page.locator("nav.nav a[href='/failures']").get_attribute("aria-current") == "page"


def test_failures_download_as_csv_and_json(tab: Tab, failing: Store) -> None:
    page = tab.open("/failures?show=jobs")
    href = page.locator("#download-csv").get_attribute("href")
    assert href == "/failures.csv?show=jobs"
    with api(failing.url, failing.token) as client:
        as_csv = client.get(href)
        as_json = client.get("/failures.json?show=jobs")
        bad = client.get("/failures.xml")
    assert as_csv.headers["content-type"] == "text/csv; charset=utf-8"
    assert as_csv.headers["content-disposition"] == 'attachment; filename="failures.csv"'
    assert as_json.headers["content-type"] == "application/json"
    assert as_json.headers["content-disposition"] == 'attachment; filename="failures.json"'
    assert bad.status_code == 404
    rows = list(csv.DictReader(io.StringIO(as_csv.text)))
    body = as_json.json()
    assert body["count"] == 2
    assert [(r["kind"], int(r["id"])) for r in rows] == [(r["kind"], r["id"]) for r in body["data"]]
    assert [(r["kind"], r["id"]) for r in body["data"]] == listed(page)
    failed = next(r for r in body["data"] if r["kind"] == "job-failed")
    assert failed["detail"].endswith("ModuleNotFoundError: No module named 'x'")


# Comparing two profiles


def _api_profile(store: Store, name: str) -> dict[str, Any]:
    with api(store.url, store.token) as client:
        body: dict[str, Any] = client.get(f"/api/v1/profiles/{store.ids[name]}").json()
    return body


def _at_max(profile: dict[str, Any]) -> dict[str, Any]:
    return [
        p
        for p in profile["probes"]
        if p["fits"] and p["micro_batch_size"] == profile["max_micro_batch_size"]
    ][-1]


def _footprint(probe: dict[str, Any]) -> int:
    copies = (probe["breakdown"] or {}).get("collective_copies_bytes", 0)
    return int(probe["peak_reserved_bytes"] + probe["non_torch_bytes"] + copies)


def test_two_profiles_side_by_side_equal_the_api(tab: Tab, failing: Store) -> None:
    a_id, b_id = failing.ids["a100"], failing.ids["h100"]
    page = tab.open(f"/compare?a={a_id}&b={b_id}")
    a, b = _api_profile(failing, "a100"), _api_profile(failing, "h100")

    def shown(line: str) -> list[str | None]:
        row = page.locator(f"#compare-table tr[data-line={line}]")
        return [
            row.locator(f"td[data-side={side}]").get_attribute("data-value")
            for side in ("a", "b", "diff")
        ]

    assert shown("mstar") == ["56", "48", "-8"]
    assert [a["max_micro_batch_size"], b["max_micro_batch_size"]] == [56, 48]
    peak_a, peak_b = _footprint(_at_max(a)), _footprint(_at_max(b))
    assert shown("peak") == [str(peak_a), str(peak_b), str(peak_b - peak_a)]
    for line, field in (
        ("part-parameters", "parameters_bytes"),
        ("part-gradients", "gradients_bytes"),
        ("part-optimizer", "optimizer_state_bytes"),
        ("part-activations", "activations_bytes"),
        ("part-allocator", "allocator_cache_bytes"),
    ):
        va, vb = _at_max(a)["breakdown"][field], _at_max(b)["breakdown"][field]
        assert shown(line) == [str(va), str(vb), str(vb - va)], line
    outside = [str(_at_max(a)["non_torch_bytes"]), str(_at_max(b)["non_torch_bytes"]), "0"]
    assert shown("part-outside") == outside
    assert "same" in page.locator("tr[data-line=part-outside] td[data-side=diff]").inner_text()

    # The chart: one series per profile, the probes' peaks, told apart by line and marker.
    page.wait_for_selector("#compare-chart[data-drawn=true]")
    drawn = page.evaluate(
        "() => { const u = window.tunerCharts.compare; return {xs: u.data[0], "
        "a: u.data[1], b: u.data[2], dash: u.series.slice(1).map(s => (s.dash || []).length), "
        "labels: u.series.slice(1).map(s => s.label)}; }"
    )
    data = json.loads(str(page.locator("#compare-chart").get_attribute("data-chart-data")))
    assert [(s["line"], s["marker"]) for s in data["series"]] == [
        ("solid", "circle"),
        ("dashed", "square"),
    ]
    assert drawn["dash"][0] == 0
    assert drawn["dash"][1] > 0
    assert drawn["labels"] == [f"A: #{a_id}", f"B: #{b_id}"]
    peaks_a = {
        p["micro_batch_size"]: _footprint(p) for p in a["probes"] if p["peak_reserved_bytes"]
    }
    peaks_b = {
        p["micro_batch_size"]: _footprint(p) for p in b["probes"] if p["peak_reserved_bytes"]
    }
    assert drawn["xs"] == sorted(peaks_a.keys() | peaks_b.keys())
    assert drawn["a"] == [peaks_a.get(x) for x in drawn["xs"]]
    assert drawn["b"] == [peaks_b.get(x) for x in drawn["xs"]]
    # The same values in a table, for the keyboard and screen readers.
    table = page.locator("#compare-points tbody tr").evaluate_all(
        "rows => rows.map(r => [Number(r.dataset.microBatch), "
        "r.cells[1].dataset.value, r.cells[2].dataset.value])"
    )
    assert table == [
        [x, str(peaks_a[x]) if x in peaks_a else "", str(peaks_b[x]) if x in peaks_b else ""]
        for x in drawn["xs"]
    ]
    tab.screenshot("compare")

    # The URL is the comparison: opened afresh, the same page; swapped, the other way round.
    page = tab.open(f"/compare?a={b_id}&b={a_id}")
    assert (
        page.locator("#compare-table tr[data-line=mstar] td[data-side=diff]").get_attribute(
            "data-value"
        )
        == "8"
    )


def test_compare_is_reachable_from_the_list_and_a_profile_page(tab: Tab, failing: Store) -> None:
    a_id, b_id = failing.ids["a100"], failing.ids["h100"]
    page = tab.open("/profiles")
    page.check(f"tr[data-profile-id='{b_id}'] input[name=p]")
    page.check(f"tr[data-profile-id='{a_id}'] input[name=p]")
    page.click("#compare-selected")
    page.wait_for_url("**/compare?*")
    ticked = sorted([a_id, b_id], reverse=True)  # the list is newest first
    assert page.url.endswith(f"/compare?a={ticked[0]}&b={ticked[1]}")
    assert page.locator("#compare-table").count() == 1

    page = tab.open(f"/profiles/{a_id}")
    options = page.locator("#compare-with-select option").evaluate_all(
        "os => os.map(o => Number(o.value))"
    )
    # The same workload (the H100) and the same device; never itself nor another project's.
    assert b_id in options
    assert a_id not in options
    assert failing.ids["other"] not in options
    assert failing.ids["broken"] not in options  # another workload on another device
    page.select_option("#compare-with-select", str(b_id))
    page.click("#compare-with button[type=submit]")
    page.wait_for_url("**/compare?*")
    assert page.url.endswith(f"/compare?a={a_id}&b={b_id}")

    # One ticked is not two: one line that says what to do.
    tab.allow("422")
    response = page.goto(failing.url + f"/compare?p={a_id}")
    assert response is not None
    assert response.status == 422
    assert "tick two rows" in page.locator(".error-box").inner_text()


def test_a_profile_of_another_project_is_not_found_on_the_compare_page(
    tab: Tab, failing: Store
) -> None:
    tab.allow("404")
    page = tab.page
    response = page.goto(failing.url + f"/compare?a={failing.ids['a100']}&b={failing.ids['other']}")
    assert response is not None
    assert response.status == 404
    assert page.locator("#compare-table").count() == 0


# Copy as `tuner recommend`


@pytest.mark.slow
def test_copy_as_tuner_recommend_gives_the_same_answer(
    tab: Tab, failing: Store, tmp_path: Path
) -> None:
    a_id = failing.ids["a100"]
    page = tab.open(f"/profiles/{a_id}?global_batch_size=512&world_size=2&policy=max")
    answer = json.loads(str(page.locator("#calc-result").get_attribute("data-answer")))
    with api(failing.url, failing.token) as client:
        asked = client.get(
            "/api/v1/recommendation",
            params={
                "workload": answer["workload_key"],
                "device": answer["device_key"],
                "global_batch_size": 512,
                "world_size": 2,
                "policy": "max",
            },
        ).json()
    command = recommend_command(RecommendationPublic.model_validate(asked))
    assert page.locator("#calc-command-text").inner_text() == command
    page.click("#calc-command button[data-copy]")
    page.wait_for_function("() => document.getElementById('calc-command-status').textContent")
    assert page.evaluate("() => navigator.clipboard.readText()") == command
    assert page.locator("#calc-command-status").inner_text() == "Copied."
    assert "--policy max" in command
    assert "--world-size 2" in command

    # The CLI, given the copied words, gives the page's answer (its age aside).
    words = shlex.split(command)
    assert words[:2] == ["tuner", "recommend"]
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "TUNER_CACHE_DIR": str(tmp_path)}
    environment.pop("TUNER_URL", None)
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "tuner.cli",
            *words[1:],
            "--json",
            "--url",
            failing.url,
            "--token",
            failing.token,
        ],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    from_cli = json.loads(ran.stdout)
    for body in (from_cli, answer):
        body.pop("profile_age_s")
    assert from_cli == answer


# The profile list's downloads


def test_the_profile_list_downloads_as_csv_and_json(tab: Tab, failing: Store) -> None:
    page = tab.open(f"/profiles?workload={failing.workloads['llama']}&sort=mstar&order=asc")
    href = page.locator("#download-json").get_attribute("href")
    assert href is not None
    assert href.startswith("/profiles.json?")
    with api(failing.url, failing.token) as client:
        as_json = client.get(href)
        as_csv = client.get(str(page.locator("#download-csv").get_attribute("href")))
        listed_by_api = client.get(
            "/api/v1/profiles", params={"workload": "llama" + "x" * 19}
        ).json()
    assert as_json.headers["content-type"] == "application/json"
    assert as_json.headers["content-disposition"] == 'attachment; filename="profiles.json"'
    assert as_csv.headers["content-type"] == "text/csv; charset=utf-8"
    assert as_csv.headers["content-disposition"] == 'attachment; filename="profiles.csv"'
    body = as_json.json()
    # The page's sort: M* ascending; the API's own order is newest first.
    assert [r["max_micro_batch_size"] for r in body["data"]] == [48, 56]
    assert body["count"] == listed_by_api["count"] == 2
    by_id = {r["id"]: r for r in listed_by_api["data"]}
    for row in body["data"]:
        theirs = by_id[row["id"]]
        for field in (
            "workload_id",
            "workload_key",
            "workload_name",
            "device_id",
            "device_key",
            "device_name",
            "max_micro_batch_size",
            "headroom",
            "budget_bytes",
            "size_cap",
            "world_size",
            "parallel_mode",
        ):
            assert row[field] == theirs[field], field
    rows = list(csv.DictReader(io.StringIO(as_csv.text)))
    assert [int(r["id"]) for r in rows] == [r["id"] for r in body["data"]]
    assert [int(r["max_micro_batch_size"]) for r in rows] == [48, 56]
    assert rows[0]["variant"] == "{}"


def test_a_download_is_bounded_whatever_the_query(
    tab: Tab, failing: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The service runs in this process: a bound of 2 stands for the real one (1,000).
    monkeypatch.setattr(queries, "EXPORT_LIMIT", 2)
    with api(failing.url, failing.token) as client:
        failed = client.get("/failures.json?page=2").json()
        profiles = client.get("/profiles.json?size=200&page=2").json()
        as_csv = client.get("/failures.csv")
        refused = client.get("/profiles.json?size=1000000")
    # Every page from the first, cut at the bound; count says how many match.
    assert len(failed["data"]) == 2
    assert failed["count"] == 9
    assert len(profiles["data"]) == 2
    assert profiles["count"] == 3  # this project's three; the other project's is not listed
    assert len(list(csv.DictReader(io.StringIO(as_csv.text)))) == 2
    # A size the page never offers is refused, as on the page.
    assert refused.status_code == 422
    assert "profiles a page" in refused.text
