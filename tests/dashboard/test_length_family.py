"""A sequence-length family in the browser: a workload built for one length links its
family; the family page charts M* and tokens per micro batch against sequence length on
each device (the measured points and the curve tuner.core.lengths answers with, read back
from uPlot's own data) and lists each length with its profile; a family measured at one
length shows its point and asks for a second; an unknown family is a 404 page.

The profiles are real: the tiny GPT example profiled on the CPU backend at three lengths
under a few MiB, once for the module (a few seconds), then stored in each test's database.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page
from sqlalchemy import select

from api import models
from api.dashboard.format import fmt_int
from api.db import Database
from api.store.profiles import upsert_workload
from tests.dashboard.conftest import Tab, signed_in
from tests.dashboard.data import store
from tests.dashboard.test_profiles_list import statements
from tests.services import ServerThread
from tuner.core import lengths
from tuner.core.results import Profile
from tuner.engine.backends import make_backend
from tuner.engine.profiler import profile_workload
from tuner.engine.workload import load_workload

MiB = 2**20
FAMILY = "tinygpt-lengths".ljust(24, "f")
SEQ_LENS = (16, 32, 64)
# One layer, a small vocabulary: a full search takes a fraction of a second per length, and
# 8 MiB leaves M* in the tens, so that lengths differ clearly.
GPT = {"layers": 1, "dim": 32, "heads": 2, "vocab": 256}
LIMIT = 8 * MiB


@pytest.fixture(scope="module")
def by_length() -> dict[int, Profile]:
    """One profile per length, its workload marked as that length of :data:`FAMILY` (as the
    engine marks the lengths of one ``--seq-lens`` search)."""
    profiles = {}
    for seq_len in SEQ_LENS:
        workload = load_workload("examples.gpt:workload", {**GPT, "seq_len": seq_len})
        found = profile_workload(workload, make_backend("cpu", memory_limit_bytes=LIMIT))
        info = found.workload.model_copy(update={"seq_len": seq_len, "length_family": FAMILY})
        profiles[seq_len] = found.model_copy(update={"workload": info})
    return profiles


def stored(database: Database, profiles: list[Profile]) -> dict[int, int]:
    """Store ``profiles``; the id of each one's workload, by its length."""
    store(database, profiles)
    with database.session() as session:
        rows = session.execute(select(models.Workload.seq_len, models.Workload.id)).all()
    return {seq_len: workload_id for seq_len, workload_id in rows if seq_len is not None}


def device_id(database: Database) -> int:
    with database.session() as session:
        found: int | None = session.scalar(select(models.Device.id))
    assert found is not None
    return found


def drawn(page: Page, name: str) -> dict[str, Any]:
    """What uPlot drew in chart ``name``: its x values and each series by key."""
    page.wait_for_selector(f"[data-estimate-chart='{name}'][data-drawn]")
    result: dict[str, Any] = page.evaluate(
        """name => {
          const u = window.tunerCharts[name];
          const keys = JSON.parse(u.root.parentElement.dataset.series);
          return {
            x: u.data[0],
            series: Object.fromEntries(keys.map((k, i) => [k, u.data[i + 1]])),
            labels: u.series.slice(1).map((s) => s.label),
            dashed: u.series.slice(1).map((s) => Boolean(s.dash)),
          };
        }""",
        name,
    )
    return result


@pytest.mark.slow
def test_a_family_charts_m_star_and_tokens_against_sequence_length(
    tab: Tab, database: Database, reader: str, by_length: dict[int, Profile]
) -> None:
    profiles = [by_length[s] for s in SEQ_LENS]
    workloads = stored(database, profiles)
    device = device_id(database)
    signed_in(tab, reader)

    # Each length's workload page, and its profile's page, link the family.
    page = tab.open(f"/workloads/{workloads[32]}")
    assert page.locator("#family-link").get_attribute("href") == f"/families/{FAMILY}"
    profile_link = page.locator(".device-card a[href^='/profiles/']").first
    assert profile_link.get_attribute("href") is not None
    profile_link.click()
    page.wait_for_selector("#family-link")
    assert page.locator("#family-link").get_attribute("href") == f"/families/{FAMILY}"
    page.locator("#family-link").click()
    page.wait_for_url(f"**/families/{FAMILY}")
    tab.check()

    mstar = drawn(page, f"lengths-{device}-mstar")
    xs = mstar["x"]
    # The range answers reach: half the shortest length to 1.25 times the longest.
    assert (xs[0], xs[-1]) == (8, 80)
    assert set(SEQ_LENS) <= set(xs)
    assert len(xs) >= 40
    measured = {s: by_length[s].max_micro_batch_size for s in SEQ_LENS}
    assert measured[16] > measured[32] > measured[64] >= 1
    assert mstar["series"]["mstar-measured"] == [measured.get(s) for s in xs]
    assert mstar["series"]["mstar-estimated"] == [
        lengths.estimate_length(profiles, list(SEQ_LENS), s).max_micro_batch_size for s in xs
    ]
    assert mstar["labels"] == ["M* measured", "M* estimated"]
    assert mstar["dashed"] == [False, True]  # points measured, a dashed line estimated

    tokens = drawn(page, f"lengths-{device}-tokens")
    assert tokens["x"] == xs
    assert tokens["series"]["tokens-measured"] == [
        measured[s] * s if s in measured else None for s in xs
    ]
    assert tokens["series"]["tokens-estimated"] == [
        m * s for m, s in zip(mstar["series"]["mstar-estimated"], xs, strict=True)
    ]

    # The table: each measured length with its profile and probes, and estimated landmarks.
    with database.session() as session:
        profile_ids = dict(
            session.execute(
                select(models.Workload.seq_len, models.Profile.id).join(models.Workload)
            ).all()
        )
    table = page.locator(f"table.lengths[data-device-id='{device}']")
    for seq_len in SEQ_LENS:
        cells = table.locator(f"tr[data-seq-len='{seq_len}'] td").all_inner_texts()
        assert cells[:4] == [
            str(seq_len),
            str(measured[seq_len]),
            "measured",
            fmt_int(measured[seq_len] * seq_len),
        ]
        assert cells[4].startswith(f"#{profile_ids[seq_len]}")
        assert cells[5] == str(len(by_length[seq_len].probes))
    estimated = table.locator("tr[data-basis='estimated']")
    assert [int(s) for s in estimated.evaluate_all("rows => rows.map(r => r.dataset.seqLen)")] == [
        8,
        24,
        48,
        80,
    ]
    longest = lengths.estimate_length(profiles, list(SEQ_LENS), 80)
    assert estimated.last.locator("td").all_inner_texts()[:4] == [
        "80",
        str(longest.max_micro_batch_size),
        "estimated",
        fmt_int(longest.tokens_per_micro_batch),
    ]
    assert page.locator("[data-family-note]").count() == 0
    tab.screenshot("length-family")


def test_a_family_measured_at_one_length_shows_the_point_and_asks_for_a_second(
    tab: Tab, database: Database, reader: str, by_length: dict[int, Profile]
) -> None:
    only = by_length[32]
    stored(database, [only])
    device = device_id(database)
    page = signed_in(tab, reader).open(f"/families/{FAMILY}")
    chart = drawn(page, f"lengths-{device}-mstar")
    assert chart["x"] == [32]
    assert chart["series"] == {"mstar-measured": [only.max_micro_batch_size]}
    assert "profile a second length" in page.locator("[data-family-note]").inner_text()
    rows = page.locator("table.lengths tbody tr")
    assert rows.count() == 1
    assert rows.first.get_attribute("data-basis") == "measured"


def test_the_family_page_costs_the_same_statements_whatever_its_history(
    database: Database, reader: str, service: ServerThread, by_length: dict[int, Profile]
) -> None:
    # An older profile at one length first: the newer one received after it is what counts.
    older = by_length[16].model_copy(
        update={"created_at": by_length[16].created_at - timedelta(hours=1)}
    )
    older = older.model_copy(update={"max_micro_batch_size": 1})
    store(database, [older])
    stored(database, [by_length[s] for s in SEQ_LENS])
    headers = {"Authorization": f"Bearer {reader}"}
    with httpx.Client(base_url=service.url, headers=headers, timeout=30) as client:
        client.get("/")  # records the token's first use, a write that happens once a minute
        with statements(service) as seen:
            response = client.get(f"/families/{FAMILY}")
    assert response.status_code == 200
    assert 'data-seq-len="16" data-basis="measured"' in response.text
    assert f'<td class="num">{by_length[16].max_micro_batch_size}</td>' in response.text
    # The family's members, their profiles' heads (tuner.answer.current picks the current
    # ones), those profiles with workload and device, their probes: not one more per
    # profile of history.
    assert len(seen) <= 4, seen


def test_a_family_registered_but_never_profiled_in_one_process_says_so(
    tab: Tab, database: Database, reader: str, by_length: dict[int, Profile]
) -> None:
    with database.session(write=True) as session:
        upsert_workload(session, by_length[16].workload_key, by_length[16].workload, project_id=1)
    page = signed_in(tab, reader).open(f"/families/{FAMILY}")
    assert "none has a profile at world size 1" in page.locator("#family-empty").inner_text()
    assert page.locator("[data-estimate-chart]").count() == 0


def test_an_unknown_family_is_a_404_page(tab: Tab, reader: str) -> None:
    tab.allow(r"status of 404")
    signed_in(tab, reader)
    for path, message in (
        ("/families/no-such-family", "no sequence-length family 'no-such-family'"),
        ("/families/" + "x" * 65, "there is no page at /families/xxx"),
    ):
        response = tab.page.goto(tab.base_url + path)
        assert response is not None
        assert response.status == 404
        assert message in tab.page.locator("#page-error").inner_text()
