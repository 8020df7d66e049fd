"""The dashboard answers the question on landing, names every run, and drops no warning,
in Chromium at 1440×900 and 390×844, over SQLite (the answer on landing over PostgreSQL
too).

One store per database kind for the whole module (a service over it, and the session's
browser): three runs of one model (one process, DDP at 2 and 4 ranks), three explored
variants (the chosen one not the fastest at M*), three sequence lengths, one model where
nothing fits, and a 40 GiB GPU profile with an out-of-memory report from training. Every
answer a page shows is compared with the JSON ``GET /api/v1/recommendation`` sends for the
same question.
"""

from __future__ import annotations

import json
import re
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httpx
import pytest
from playwright.sync_api import Browser, Page

from api import migrate
from api.config import ServiceSettings
from api.dashboard.format import fmt_bytes, fmt_rate
from api.db import Database
from api.main import create_app
from tests.api.conftest import fresh_postgres_database, make_token
from tests.api.documents import sample_profile
from tests.api.test_variants import explored
from tests.dashboard.conftest import SCREENSHOTS, Tab, open_tab, signed_in
from tests.dashboard.data import T0, cuda_profile, nothing_fits_profile, store
from tests.dashboard.test_world_sizes import DDP_KEY, ddp_profile
from tests.services import ServerThread
from tuner.core.plan import format_runs
from tuner.core.results import Profile

VIEWPORTS = {"desktop": (1440, 900), "phone": (390, 844)}
LENGTHS = (64, 128, 256)
# Training ran out of memory at 40 on the GPU and went on at 30: answers stay at or below 30.
OOM_FAILED, OOM_SETTLED = 40, 30


def length_profiles() -> list[Profile]:
    """One model at three sequence lengths, each length a workload of one family."""
    profiles = []
    for index, seq_len in enumerate(LENGTHS):
        base = sample_profile(
            max_micro_batch_size=16 // (index + 1),
            workload_key=f"len{seq_len}".ljust(24, "l"),
            workload_name="gpt-len",
            created_at=T0 + timedelta(days=2, minutes=index),
        )
        info = base.workload.model_copy(
            update={"seq_len": seq_len, "length_family": "gpt-len".ljust(24, "f")}
        )
        profiles.append(base.model_copy(update={"workload": info}))
    return profiles


@dataclass(frozen=True)
class Fleet:
    url: str
    token: str
    label: str
    ids: dict[str, int]
    gpu: Profile


@pytest.fixture(scope="module")
def fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """The fleet's store, on SQLite; on PostgreSQL too for the test parametrized so (the
    answer on landing reads the same store queries as the API)."""
    if getattr(request, "param", "sqlite") == "sqlite":
        path = tmp_path_factory.mktemp("landing") / "tuner.db"
        yield from _fleet(f"sqlite:///{path}", "sqlite")
    else:
        with fresh_postgres_database(request.getfixturevalue("postgres_server")) as url:
            yield from _fleet(url, "postgres")


def _fleet(url: str, label: str) -> Generator[Fleet, None, None]:
    migrate.upgrade(url)
    database = Database(url)
    token = make_token(database, "admin", name="ada")
    gpu = cuda_profile()
    one = sample_profile(max_micro_batch_size=8, workload_name="gpt-test")
    named = {
        "one": one,
        "ddp2": ddp_profile(2),
        "ddp4": ddp_profile(4),
        # The exploration chose bf16 (its plan ran fastest), not variant1, the fastest at M*.
        **{f"variant{i}": p for i, p in enumerate(explored(chosen=2, timed=True))},
        **{f"len{p.workload.seq_len}": p for p in length_profiles()},
        "huge": nothing_fits_profile(),
        "gpu": gpu,  # the newest: what the landing page asks about first
    }
    ids = dict(zip(named, store(database, list(named.values())), strict=True))
    database.dispose()
    with ServerThread(create_app(ServiceSettings(database_url=url))) as server:
        with api(server.url, token) as client:
            report = client.post(
                "/api/v1/oom-reports",
                json={
                    "workload": gpu.workload_key,
                    "device": gpu.device_key,
                    "micro_batch_size": OOM_FAILED,
                    "settled_micro_batch_size": OOM_SETTLED,
                    "message": "CUDA out of memory. Tried to allocate 2.00 GiB",
                },
            )
            assert report.status_code == 201, report.text
        yield Fleet(server.url, token, label, ids, gpu)


def api(base_url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


@pytest.fixture(params=list(VIEWPORTS))
def tab(request: pytest.FixtureRequest, browser: Browser, fleet: Fleet) -> Iterator[Tab]:
    label = f"{fleet.label}-{request.param}"
    with open_tab(browser, fleet.url, label, VIEWPORTS[request.param]) as opened:
        yield signed_in(opened, fleet.token)


def api_answer(fleet: Fleet, query: str) -> tuple[int, dict[str, Any]]:
    with api(fleet.url, fleet.token) as client:
        response = client.get("/api/v1/recommendation?" + query)
    body: dict[str, Any] = response.json()
    return response.status_code, body


def shown_answer(page: Page) -> dict[str, Any]:
    """The answer the page rendered (its data, as the route sent it), checked against what
    the page says in words."""
    raw = page.locator("#calc-result").get_attribute("data-answer")
    assert raw is not None
    answer: dict[str, Any] = json.loads(raw)
    assert page.locator("#calc-micro").inner_text() == str(answer["micro_batch_size"])
    assert page.locator("#calc-accum").inner_text() == str(answer["grad_accum"])
    assert page.locator("#calc-world-size").inner_text() == str(answer["world_size"])
    assert page.locator("#calc-split").inner_text().startswith(format_runs(answer["split"]))
    assert (
        page.locator("#calc-peak").inner_text().startswith(fmt_bytes(answer["expected_peak_bytes"]))
    )
    speed = answer["expected_samples_per_second"]
    assert page.locator("#calc-speed").inner_text() == (
        fmt_rate(speed) if speed is not None else "not measured"
    )
    assert page.locator("#calc-reason").inner_text() == answer["reason"]
    assert page.locator("#calc-result [data-basis]").get_attribute("data-basis") == answer["basis"]
    return answer


def same_answer(page: Page, fleet: Fleet) -> dict[str, Any]:
    """The page's answer equals the API's JSON for the question in the page's own link to
    it (all but the age, which moves between the two reads)."""
    link = page.locator("#calc-api").get_attribute("href")
    assert link is not None
    status, expected = api_answer(fleet, urlsplit(link).query)
    assert status == 200, expected
    shown = shown_answer(page)
    shown.pop("profile_age_s")
    expected.pop("profile_age_s")
    assert shown == expected
    return shown


def fits_the_width(page: Page) -> None:
    """Nothing wider than the window: a phone never scrolls the page sideways."""
    overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0


def ask(page: Page, **fields: str) -> None:
    """Fill the calculator as a person does; the answer replaces the old one and the URL
    keeps the question."""
    for name, value in fields.items():
        selector = f"#calc-form [name={name}]"
        if page.locator(selector).evaluate("e => e.tagName") == "SELECT":
            page.select_option(selector, value)
        else:
            page.fill(selector, value)
    with page.expect_response(lambda r: r.request.headers.get("hx-request") == "true"):
        page.click("#calc-form button[type=submit]")
    for name, value in fields.items():
        page.wait_for_function(
            "([name, value]) => new URLSearchParams(location.search).get(name) === value",
            arg=[name, value],
        )


@pytest.mark.slow
@pytest.mark.parametrize("fleet", ["sqlite", "postgres"], indirect=True)
def test_the_landing_page_answers_as_the_api_does(tab: Tab, fleet: Fleet) -> None:
    gpu = fleet.gpu
    # The GPU's workload asked: its newest profile's run (a 40 GiB GPU, one process).
    page = tab.open(f"/?workload={gpu.workload_key}")
    assert page.locator("#calc-workload").input_value() == gpu.workload_key
    assert page.locator("#calc-device").input_value() == gpu.device_key
    assert page.locator("#calc-world").input_value() == "1"
    assert page.locator("#calc-parallel").input_value() == "none"
    answer = same_answer(page, fleet)
    assert answer["global_batch_size"] == 256
    assert answer["basis"] == "measured"
    fits_the_width(page)
    shot(page, "landing", tab)

    ask(page, global_batch_size="1000", world_size="8", policy="max")
    answer = same_answer(page, fleet)
    assert answer["split"] == [[30, 4], [5, 1]]  # 125 a rank, at most 30 since the OOM
    # The question is in the URL: opened again, the page answers it again.
    query = dict(parse_qsl(urlsplit(page.url).query))
    assert query["global_batch_size"] == "1000"
    assert query["world_size"] == "8"
    page = tab.open(urlsplit(page.url).path + "?" + urlsplit(page.url).query)
    assert same_answer(page, fleet)["split"] == [[30, 4], [5, 1]]

    # Another workload and device: the DDP runs of the small model, at 2 ranks.
    ask(
        page,
        workload=DDP_KEY,
        device="d" * 24,
        world_size="2",
        parallel="ddp",
        global_batch_size="256",
    )
    answer = same_answer(page, fleet)
    assert answer["profile_id"] == fleet.ids["ddp2"]
    assert answer["profile_parallel"] == "ddp"
    fits_the_width(page)


def test_a_refused_question_shows_the_apis_own_message(tab: Tab, fleet: Fleet) -> None:
    page = tab.open(f"/?workload={fleet.gpu.workload_key}&global_batch_size=100&world_size=3")
    status, body = api_answer(
        fleet,
        f"workload={fleet.gpu.workload_key}&device={fleet.gpu.device_key}"
        "&global_batch_size=100&world_size=3&parallel=none",
    )
    assert status == 422
    assert page.locator("#calc-error").inner_text() == body["error"]["message"]
    assert page.locator("#calc-error").get_attribute("data-status") == "422"
    assert page.locator("#calc-result").count() == 0
    fits_the_width(page)


def test_a_ddp_profile_opens_on_its_own_run_with_the_calculator_first(
    tab: Tab, fleet: Fleet
) -> None:
    page = tab.open(f"/profiles/{fleet.ids['ddp2']}")
    badge = page.locator("#run-badges [data-run=world]")
    assert badge.inner_text() == "DDP × 2"
    first = page.evaluate(
        """() => Boolean(document.getElementById('calculator').compareDocumentPosition(
                 document.getElementById('memory-chart')) & Node.DOCUMENT_POSITION_FOLLOWING)"""
    )
    assert first
    assert page.locator("#calc-world").input_value() == "2"
    assert page.locator("#calc-parallel").input_value() == "ddp"
    assert page.locator("#calc-error").count() == 0
    answer = same_answer(page, fleet)
    assert answer["profile_id"] == fleet.ids["ddp2"]
    assert answer["world_size"] == 2
    assert answer["parallel"] == "ddp"
    fits_the_width(page)

    # The mode selector asks the API as it is: a DDP workload asked in one process is
    # refused, with the API's own words.
    ask(page, parallel="none")
    query = urlsplit(str(page.locator("#calc-api").get_attribute("href"))).query
    status, body = api_answer(fleet, query)
    assert status == 422
    assert page.locator("#calc-error").inner_text() == body["error"]["message"]
    assert page.locator("#run-badges").count() == 1  # the rest of the page is still there


def test_every_list_header_and_menu_names_the_run(tab: Tab, fleet: Fleet) -> None:
    page = tab.open("/profiles?size=25")
    ids = fleet.ids

    def badges(profile_id: int) -> list[str]:
        cells = page.locator(f"tr[data-profile-id='{profile_id}'] .run-badges .badge")
        return [text.strip() for text in cells.all_inner_texts()]

    assert badges(ids["one"]) == ["1 process"]
    assert badges(ids["ddp2"]) == ["DDP × 2"]
    assert badges(ids["ddp4"]) == ["DDP × 4"]
    # Recommendations pick the newest profile at each world size: W=2 is not superseded
    # by the newer W=4 run.
    ddp2_status = page.locator(f"tr[data-profile-id='{ids['ddp2']}'] [data-status]")
    assert ddp2_status.get_attribute("data-status") == "current"
    assert badges(ids["len128"]) == ["1 process", "seq 128"]
    assert badges(ids["variant1"]) == ["1 process", "checkpointing=true", "precision=fp32"]
    fits_the_width(page)

    menu = page.locator("#filter-workload option").all_inner_texts()
    for label in (
        "gpt-test",
        "gpt-test · DDP",
        "gpt-len · seq 64",
        "gpt-len · seq 256",
        "gpt-test · checkpointing=false precision=bf16",
    ):
        assert label in menu
    assert not [label for label in menu if re.search(r"\([0-9a-z]{8}\)", label)]  # no hashes
    assert "NVIDIA A100 40GB · 40.0 GiB" in page.locator("#filter-device").inner_text()
    shot(page, "profiles", tab)

    page = tab.open("/workloads")
    rows = page.locator("#workloads-table tbody tr")
    texts = [" ".join(t.split()) for t in rows.all_inner_texts()]
    assert any("gpt-test DDP" in t for t in texts)
    assert any("gpt-len seq 128" in t for t in texts)
    assert any("gpt-test checkpointing=true precision=fp32" in t for t in texts)
    fits_the_width(page)

    page.click("#workloads-table a:text-is('gpt-test') >> nth=0")
    page.wait_for_url("**/workloads/*")
    page = tab.open(f"/profiles/{ids['len64']}")
    assert page.locator("#run-badges").inner_text().split() == ["1", "process", "seq", "64"]


@pytest.mark.slow
def test_no_warning_is_dropped_and_the_oom_reads_one_number(tab: Tab, fleet: Fleet) -> None:
    gpu, cap = fleet.gpu, OOM_SETTLED
    phrase = f"out of memory reported in training: recommendations use at most {cap}"
    # One process measured, DDP asked at 4 ranks: the answer says what it does not know.
    page = tab.open(
        f"/?workload={gpu.workload_key}&device={gpu.device_key}"
        "&global_batch_size=256&world_size=4&parallel=ddp"
    )
    answer = same_answer(page, fleet)
    assert answer["one_process_only"] is True
    assert answer["caveat"]
    assert page.locator("[data-warning=one-process]").is_visible()
    assert page.locator("[data-warning=caveat]").inner_text() == answer["caveat"]
    assert answer["oom_limit"] == cap + 1
    assert phrase in page.locator("[data-warning=oom]").inner_text().lower()
    fits_the_width(page)

    # Measured at 2 and 4 ranks, asked at 3: estimated, with the fit's error kept as margin.
    page = tab.open(
        f"/?workload={DDP_KEY}&device={'d' * 24}&global_batch_size=300&world_size=3&parallel=ddp"
    )
    answer = same_answer(page, fleet)
    assert answer["expected_error"] is not None
    assert page.locator("[data-warning=expected-error]").is_visible()

    # The OOM, wherever it is shown: one phrase and one number.
    page = tab.open(f"/profiles/{fleet.ids['gpu']}")
    said = [
        page.locator("#oom-banner").inner_text(),
        page.locator("#calc-warnings [data-warning=oom]").inner_text(),
        page.locator(".page-head [data-status]").get_attribute("title") or "",
    ]
    assert page.locator(".page-head [data-status]").inner_text() == f"OOM: at most {cap}"
    memory = page.wait_for_selector("#memory-chart[data-drawn]")
    assert memory is not None
    drawn = page.evaluate(
        """() => {
          const u = window.tunerCharts.memory;
          const keys = JSON.parse(document.getElementById('memory-chart').dataset.series);
          const oom = u.data[1 + keys.indexOf('oom')];
          const label = u.series[1 + keys.indexOf('oom')].label;
          return {x: u.data[0].filter((x, i) => oom[i] !== null), label};
        }"""
    )
    assert drawn == {"x": [cap + 1], "label": f"OOM in training: at most {cap}"}
    shot(page, "profile", tab)
    page = tab.open("/profiles")
    said.append(
        page.locator(f"tr[data-profile-id='{fleet.ids['gpu']}'] [data-status]").inner_text()
    )
    page = tab.open(f"/profiles/{fleet.ids['gpu']}")
    page.click("h1 a")
    page.wait_for_url("**/workloads/*")
    said.append(page.locator(".device-card [data-warning=oom]").inner_text())
    for text in said:
        numbers = re.findall(r"at most (\d+)", text)
        assert numbers == [str(cap)], text
        assert "below" not in text, text


def shot(page: Page, name: str, tab: Tab) -> None:
    """The page as it stands, for people (test-artifacts/screenshots/)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}-{tab.label}.png"), full_page=True)


@pytest.mark.slow
def test_every_page_fits_a_phone_and_an_unknown_path_is_a_page(tab: Tab, fleet: Fleet) -> None:
    ids = fleet.ids
    pages = [
        "/",
        "/profiles",
        f"/profiles/{ids['gpu']}",
        f"/profiles/{ids['variant1']}",
        "/workloads",
        "/devices",
        "/families/" + "gpt-len".ljust(24, "f"),
        "/jobs",
    ]
    for path in pages:
        page = tab.open(path)
        fits_the_width(page)
        problems = page.evaluate(
            """() => {
              const out = [];
              // A table wider than the window scrolls in its own box, with a hint above.
              for (const table of document.querySelectorAll('table')) {
                const wrap = table.closest('.table-wrap');
                const wide = table.getBoundingClientRect().right > window.innerWidth + 1;
                if (wide && !wrap) out.push('unscrollable table ' + table.className);
                if (wrap && wrap.scrollWidth > wrap.clientWidth + 1) {
                  const hint = wrap.previousElementSibling;
                  if (!hint || !hint.classList.contains('scroll-hint')) out.push('no hint');
                }
              }
              // A badge (a name, a mode, an option) is never broken across lines.
              for (const badge of document.querySelectorAll('.badge')) {
                const line = parseFloat(getComputedStyle(badge).lineHeight) || 20;
                if (badge.getBoundingClientRect().height > 1.8 * line) {
                  out.push('broken badge ' + badge.textContent);
                }
              }
              return out;
            }"""
        )
        assert problems == [], path

    # The devices page lists each device with its memory, and leads to its profiles.
    page = tab.open("/devices")
    gpu_row = page.locator("#devices-table tr", has_text="NVIDIA A100 40GB")
    assert "40.0 GiB" in gpu_row.inner_text()
    gpu_row.locator("a").click()
    page.wait_for_url("**/profiles?device=*")
    assert page.locator("#results tbody tr").count() == 1

    # Past the last page, the count stays true.
    page = tab.open("/profiles?page=9")
    assert page.locator("#result-count").inner_text() == (
        f"{len(ids)} profiles, on 1 page: page 9 is past the end."
    )

    # Unknown paths: the styled page, under the reader's own header; the API keeps JSON.
    for path in ("/no/such/page", "/profiles/not-a-number", "/profiles/0", "/profiles/999"):
        tab.allow(r"status of 404")
        response = page.goto(fleet.url + path)
        assert response is not None
        assert response.status == 404
        assert page.locator("h1").inner_text().startswith("Not found")
        assert page.locator(".who-name").inner_text().startswith("ada")
        assert "Input should be" not in page.locator("#page-error").inner_text()
        fits_the_width(page)
    with api(fleet.url, fleet.token) as client:
        missing = client.get("/api/v1/no-such-thing")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    shot(page, "not-found", tab)


def in_view(page: Page, selector: str) -> bool:
    """Whether every element ``selector`` finds is shown and inside the window's width."""
    boxes: list[tuple[bool, float, float]] = page.locator(selector).evaluate_all(
        """els => els.map(e => { const r = e.getBoundingClientRect();
                                return [r.width > 0 && r.height > 0, r.left, r.right]; })"""
    )
    width = page.evaluate("() => window.innerWidth")
    return bool(boxes) and all(
        shown and left >= 0 and right <= width for shown, left, right in boxes
    )


def test_the_variants_panel_marks_the_variant_the_exploration_chose(tab: Tab, fleet: Fleet) -> None:
    ids = fleet.ids
    with api(fleet.url, fleet.token) as client:
        rows = client.get(f"/api/v1/profiles/{ids['variant0']}/variants").json()["data"]
    fastest_at_max = max(rows, key=lambda row: row["samples_per_second"])["profile_id"]
    [chosen] = [row["profile_id"] for row in rows if row["chosen"]]
    assert chosen == ids["variant2"] != fastest_at_max == ids["variant1"]

    # On the page of the variant fastest at M*, the mark is on the one the exploration chose.
    page = tab.open(f"/profiles/{ids['variant1']}")
    marked = page.locator("#variants tr[data-chosen]").evaluate_all(
        "rows => rows.map(r => Number(r.dataset.profileId))"
    )
    assert marked == [chosen]
    assert page.locator("#variants [data-mark=chosen]").inner_text() == "chosen"
    assert in_view(page, "#variants [data-mark=chosen]")
    choice = page.locator("#variants-choice").inner_text()
    assert "chose checkpointing=false precision=bf16" in choice
    assert page.locator("#run-badges [data-mark=chosen]").count() == 0
    fits_the_width(page)

    # The chosen variant's own page says so in its header.
    page = tab.open(f"/profiles/{chosen}")
    assert page.locator("#run-badges [data-mark=chosen]").inner_text() == "chosen variant"
    assert in_view(page, "#run-badges [data-mark=chosen]")
    assert page.locator("#variants tr.is-current").get_attribute("data-chosen") == "true"
    shot(page, "profile-variants", tab)


def test_the_profile_list_keeps_every_column_and_status_on_screen(tab: Tab, fleet: Fleet) -> None:
    page = tab.open("/profiles?size=25")
    rows = page.locator("#profiles-table tbody tr")
    assert rows.count() == len(fleet.ids)
    # No column past the right edge: the table needs no sideways scrolling, so no hint.
    scrolls = page.locator("#results .table-wrap").evaluate("w => w.scrollWidth - w.clientWidth")
    assert scrolls <= 0
    assert page.locator("#results .scroll-hint").count() == 0
    overflowing = page.locator("#profiles-table th, #profiles-table td").evaluate_all(
        """cells => cells.filter(c => c.offsetParent !== null
                                 && c.getBoundingClientRect().right > window.innerWidth)
                         .map(c => c.className + ': ' + c.innerText)"""
    )
    assert overflowing == []
    # Every row's status is in view, and the memory free at M* still reads on a phone.
    assert in_view(page, "#profiles-table tbody [data-status]")
    gpu_row = page.locator(f"tr[data-profile-id='{fleet.ids['gpu']}']")
    assert gpu_row.locator("[data-status]").inner_text() == f"OOM: at most {OOM_SETTLED}"
    free = (
        gpu_row.locator("[data-free]")
        if tab.label.endswith("phone")
        else gpu_row.locator("td.num[title^='budget']")
    )
    assert free.is_visible()
    assert re.search(r"\d(\.\d+)? [KMG]iB", free.inner_text())
    fits_the_width(page)
    shot(page, "profiles-fit", tab)


def wait_for_field(page: Page, selector: str, value: str) -> None:
    page.wait_for_function(
        "([selector, value]) => document.querySelector(selector).value === value",
        arg=[selector, value],
    )


@pytest.mark.slow
def test_another_workload_asks_at_its_own_world_size_and_mode(tab: Tab, fleet: Fleet) -> None:
    ids = fleet.ids
    # On the GPU profile's run (one process); then the DDP workload is chosen.
    page = tab.open(f"/?workload={fleet.gpu.workload_key}")
    assert page.locator("#calc-world").input_value() == "1"
    with page.expect_response(lambda r: "workload=" in r.url):
        page.select_option("#calc-workload", DDP_KEY)
    wait_for_field(page, "#calc-world", "4")  # its newest profile ran DDP at 4 ranks
    assert page.locator("#calc-parallel").input_value() == "ddp"
    # The policy menu shows the policy the answer used (it went blank before).
    assert page.locator("#calc-policy").input_value() == "balanced"
    assert page.locator("#calc-device").input_value() == "d" * 24
    answer = same_answer(page, fleet)
    assert (answer["profile_id"], answer["world_size"], answer["parallel"]) == (
        ids["ddp4"],
        4,
        "ddp",
    )
    assert answer["one_process_only"] is False
    # The URL keeps what the reader chose, so a reload asks the same.
    assert dict(parse_qsl(urlsplit(page.url).query)) == {"workload": DDP_KEY}
    page = tab.open(urlsplit(page.url).path + "?" + urlsplit(page.url).query)
    assert page.locator("#calc-world").input_value() == "4"
    assert same_answer(page, fleet)["profile_id"] == ids["ddp4"]

    # Back to the one-process model: its own run again.
    with page.expect_response(lambda r: "workload=" in r.url):
        page.select_option("#calc-workload", fleet.gpu.workload_key)
    wait_for_field(page, "#calc-world", "1")
    assert page.locator("#calc-parallel").input_value() == "none"
    assert same_answer(page, fleet)["profile_id"] == ids["gpu"]
    fits_the_width(page)

    # A world size set in the URL, or typed, stays; the mode still follows the workload.
    page = tab.open(f"/?workload={fleet.gpu.workload_key}&world_size=8")
    with page.expect_response(lambda r: "workload=" in r.url):
        page.select_option("#calc-workload", DDP_KEY)
    wait_for_field(page, "#calc-parallel", "ddp")
    assert page.locator("#calc-world").input_value() == "8"
    answer = same_answer(page, fleet)
    assert (answer["world_size"], answer["parallel"]) == (8, "ddp")
    ask(page, world_size="2")
    with page.expect_response(lambda r: "workload=" in r.url):
        page.select_option("#calc-workload", fleet.gpu.workload_key)
    wait_for_field(page, "#calc-parallel", "none")
    assert page.locator("#calc-world").input_value() == "2"
    assert same_answer(page, fleet)["world_size"] == 2
