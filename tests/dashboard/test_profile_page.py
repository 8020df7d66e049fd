"""One profile in the browser: the charts draw exactly the stored probes (read back from
uPlot's own data arrays), the breakdown at M* adds up, and the calculator shows what
GET /api/v1/recommendation answers, errors included."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page

from api.dashboard.format import fmt_bytes
from api.db import Database
from tests.api.documents import MiB, sample_profile
from tests.api.test_variants import explored
from tests.dashboard.conftest import Tab, signed_in
from tests.dashboard.data import T0, cuda_profile, nothing_fits_profile, store
from tests.services import ServerThread
from tuner.core.results import OUTSIDE_BLOCKS, Profile


def chart(page: Page, name: str) -> dict[str, Any]:
    """What uPlot was given: its x values and series, by the keys the page names them."""
    page.wait_for_selector(f"[data-chart={name}][data-drawn]")
    drawn: dict[str, Any] = page.evaluate(
        """name => {
          const u = window.tunerCharts[name];
          const keys = JSON.parse(u.root.parentElement.dataset.series);
          return {x: u.data[0], labels: u.series.slice(1).map(s => s.label),
                  series: Object.fromEntries(keys.map((k, i) => [k, u.data[i + 1]])),
                  bands: (u.bands || []).map(b => b.series.map(i => keys[i - 1]))};
        }""",
        name,
    )
    return drawn


def last_by_size(profile: Profile) -> dict[int, Any]:
    return {p.micro_batch_size: p for p in profile.probes}


def test_the_memory_chart_draws_every_stored_probe(
    tab: Tab, database: Database, reader: str
) -> None:
    profile = cuda_profile()
    (profile_id,) = store(database, [profile])
    page = signed_in(tab, reader).open(f"/profiles/{profile_id}")
    drawn = chart(page, "memory")

    probes = last_by_size(profile)
    sizes = sorted(probes)
    assert drawn["x"] == [0, *sizes]
    series = drawn["series"]
    at = [None, *(probes[m] for m in sizes)]
    assert series["allocated"] == [p and p.peak_allocated_bytes for p in at]
    assert series["reserved"] == [p and p.peak_reserved_bytes for p in at]
    assert series["footprint"] == [p and p.footprint_bytes for p in at]
    assert profile.fit is not None
    assert series["fit"] == pytest.approx([profile.fit.predict(m) for m in drawn["x"]])
    capacity = profile.device.capacity_bytes
    assert set(series["capacity"]) == {capacity}
    assert set(series["budget"]) == {profile.budget_bytes}
    assert drawn["bands"] == [["capacity", "budget"]]  # the headroom band
    # The failed probes: 57 ran over the budget; 60 and 64 ran out of memory before their
    # step finished, so they sit on the capacity line.
    failed = dict(zip(drawn["x"], series["failed"], strict=True))
    assert {m: y for m, y in failed.items() if y is not None} == {
        57: probes[57].footprint_bytes,
        60: capacity,
        64: capacity,
    }
    marked = dict(zip(drawn["x"], series["max"], strict=True))
    assert {m: y for m, y in marked.items() if y is not None} == {56: probes[56].footprint_bytes}
    assert "M* = 56" in drawn["labels"]

    # And the marker is on the canvas: the pixel at (56, its footprint) is M*'s green.
    pixel = page.evaluate(
        """() => {
          const u = window.tunerCharts.memory;
          const i = u.data[0].indexOf(56);
          const key = JSON.parse(u.root.parentElement.dataset.series).indexOf('max') + 1;
          const x = Math.round(u.valToPos(56, 'x', true));
          const y = Math.round(u.valToPos(u.data[key][i], 'y', true));
          return Array.from(u.ctx.getImageData(x, y, 1, 1).data);
        }"""
    )
    assert pixel[:3] == [0x1A, 0x7F, 0x4B]
    tab.screenshot("profile")


def test_the_throughput_chart_draws_the_fitting_probes(
    tab: Tab, database: Database, reader: str
) -> None:
    profile = cuda_profile()
    (profile_id,) = store(database, [profile])
    page = signed_in(tab, reader).open(f"/profiles/{profile_id}")
    drawn = chart(page, "throughput")
    fitting = {p.micro_batch_size: p.samples_per_second for p in profile.probes if p.fits}
    assert drawn["x"] == sorted(fitting)
    assert drawn["series"]["speed"] == [fitting[m] for m in sorted(fitting)]
    assert [y for y in drawn["series"]["max"] if y is not None] == [fitting[56]]


def test_the_breakdown_at_max_lists_each_part(tab: Tab, database: Database, reader: str) -> None:
    profile = cuda_profile()
    (profile_id,) = store(database, [profile])
    page = signed_in(tab, reader).open(f"/profiles/{profile_id}")
    probe = last_by_size(profile)[56]
    assert probe.breakdown is not None
    rows = page.locator("#breakdown table tr").evaluate_all(
        "rows => rows.map(r => [r.cells[0].innerText.trim(), r.cells[1].innerText.trim()])"
    )
    assert rows == [
        ["Parameters", fmt_bytes(probe.breakdown.parameters_bytes)],
        ["Gradients", fmt_bytes(probe.breakdown.gradients_bytes)],
        ["Optimizer state", fmt_bytes(probe.breakdown.optimizer_state_bytes)],
        ["Activations and temporaries", fmt_bytes(probe.breakdown.activations_bytes)],
        ["Allocator cache", fmt_bytes(probe.breakdown.allocator_cache_bytes)],
        ["Outside torch", fmt_bytes(probe.non_torch_bytes)],
        ["Free", fmt_bytes(profile.device.capacity_bytes - (probe.footprint_bytes or 0))],
    ]
    assert page.locator("#stat-mstar").inner_text() == "56"
    sizes = page.locator("#probes-table tbody tr").evaluate_all(
        "rows => rows.map(r => [Number(r.dataset.size), r.dataset.fits === 'true'])"
    )
    assert sizes == [[p.micro_batch_size, p.fits] for p in profile.probes]


def with_blocks(profile: Profile, by_block: dict[str, int], phase: str) -> Profile:
    """``profile`` with the probe at M* recording where its peak is."""
    probes = list(profile.probes)
    index = max(
        i for i, p in enumerate(probes) if p.micro_batch_size == profile.max_micro_batch_size
    )
    breakdown = probes[index].breakdown
    assert breakdown is not None
    located = breakdown.model_copy(
        update={"activations_by_block_bytes": by_block, "peak_phase": phase}
    )
    probes[index] = probes[index].model_copy(update={"breakdown": located})
    return profile.model_copy(update={"probes": probes})


def test_the_blocks_at_max_draw_one_bar_each_in_proportion(
    tab: Tab, database: Database, reader: str
) -> None:
    by_block = {
        "embed": 2 * MiB,
        "blocks.0": 48 * MiB,
        "blocks.1": 24 * MiB,
        OUTSIDE_BLOCKS: 12 * MiB,
    }
    plain, located = store(
        database,
        [
            cuda_profile(),
            with_blocks(cuda_profile(created_at=T0 + timedelta(days=1)), by_block, "backward"),
        ],
    )
    page = signed_in(tab, reader).open(f"/profiles/{located}")
    rows = page.locator("#blocks tr").evaluate_all(
        """rows => rows.map(r => [r.dataset.block, r.cells[2].innerText.trim(),
                                 r.querySelector('rect.fill').getBoundingClientRect().width,
                                 r.querySelector('rect.track').getBoundingClientRect().width])"""
    )
    assert [row[:2] for row in rows] == [[name, fmt_bytes(size)] for name, size in by_block.items()]
    drawn = {row[0]: row[2] / row[3] for row in rows}  # each bar against its full width
    largest = max(by_block.values())
    assert drawn == pytest.approx(
        {name: size / largest for name, size in by_block.items()}, abs=0.01
    )
    assert page.locator("#peak-phase").inner_text() == "backward"
    assert "checkpointing the longest bars" in page.locator("#blocks").inner_text()
    tab.screenshot("profile-blocks")
    # A profile measured without locating has no such panel.
    page = signed_in(tab, reader).open(f"/profiles/{plain}")
    assert page.locator("#blocks").count() == 0
    assert page.locator("#variants").count() == 0  # nor one of variants, never explored


def test_explored_variants_are_compared_and_linked(
    tab: Tab, database: Database, reader: str
) -> None:
    profiles = explored(chosen=2)
    ids = store(database, profiles)
    page = signed_in(tab, reader).open(f"/profiles/{ids[1]}")
    rows = page.locator("#variants tbody tr").evaluate_all(
        """rows => rows.map(r => [Number(r.dataset.profileId), r.cells[0].innerText.trim(),
                                 r.cells[1].innerText.trim(), r.className,
                                 r.querySelector('rect.fill').getBoundingClientRect().width /
                                 r.querySelector('rect.track').getBoundingClientRect().width])"""
    )
    assert [row[0] for row in rows] == ids
    assert rows[0][1] == "checkpointing=false precision=fp32"
    assert rows[1][1] == "checkpointing=true precision=fp32 this profile"
    assert [row[2] for row in rows] == [str(p.max_micro_batch_size) for p in profiles]
    assert [row[3] for row in rows] == ["", "is-current", ""]
    speeds = []
    for profile in profiles:
        at_max = profile.probe_at(profile.max_micro_batch_size)
        assert at_max is not None
        speeds.append(at_max.samples_per_second or 0.0)
    assert [row[4] for row in rows] == pytest.approx([v / max(speeds) for v in speeds], abs=0.01)
    # Marked: the variant the exploration chose, not the one fastest at M*.
    chosen = page.locator("#variants tr:has(.badge.tone-ok)").get_attribute("data-profile-id")
    assert chosen == str(ids[2]) != str(ids[speeds.index(max(speeds))])
    tab.screenshot("profile-variants")
    page.click(f"#variants tr[data-profile-id='{ids[2]}'] a")
    page.wait_for_url(f"**/profiles/{ids[2]}")
    assert page.locator("#variants tr.is-current").get_attribute("data-profile-id") == str(ids[2])


def recommendation(service: ServerThread, token: str, **params: Any) -> httpx.Response:
    with httpx.Client(base_url=service.url, timeout=10) as client:
        return client.get(
            "/api/v1/recommendation",
            params=params,
            headers={"Authorization": f"Bearer {token}"},
        )


def calculate(page: Page, global_batch: int, world: int, policy: str) -> None:
    """Ask as a person does; the answer is in place once the URL holds the question."""
    page.fill("#calc-global", str(global_batch))
    page.fill("#calc-world", str(world))
    page.select_option("#calc-policy", policy)
    page.click("#calc-form button[type=submit]")
    wanted = f"global_batch_size={global_batch}&world_size={world}&policy={policy}"
    page.wait_for_selector(f"#calc-api[href*='{wanted}']")


@pytest.mark.slow
def test_the_calculator_agrees_with_the_recommendation_api(
    tab: Tab, database: Database, reader: str, service: ServerThread
) -> None:
    profile = cuda_profile()
    (profile_id,) = store(database, [profile])
    page = signed_in(tab, reader).open(f"/profiles/{profile_id}")
    assert page.locator("#calc-answer").get_attribute("data-state") == "done"
    for global_batch, world, policy in (
        (1000, 8, "balanced"),
        (256, 1, "max"),
        (1000, 8, "max"),
        (96, 1, "even"),
        (96, 2, "throughput"),
    ):
        calculate(page, global_batch, world, policy)
        expected = recommendation(
            service,
            reader,
            workload=profile.workload_key,
            device=profile.device_key,
            global_batch_size=global_batch,
            world_size=world,
            policy=policy,
        ).json()
        assert page.locator("#calc-micro").inner_text() == str(expected["micro_batch_size"])
        assert page.locator("#calc-accum").inner_text() == str(expected["grad_accum"])
        shown_split = page.locator("#calc-split").get_attribute("data-split")
        assert shown_split is not None
        assert json.loads(shown_split) == expected["split"]  # runs [size, count]
        assert page.locator("#calc-error").count() == 0
        assert page.locator("#calc-reason").inner_text() == expected["reason"]
    # 1000 over 8 ranks is 125 a rank: 2×56 + 13 under max, the last micro batch smaller;
    # balanced (the form's default) runs the same 3 micro batches as 2×42 + 41.
    calculate(page, 1000, 8, "max")
    assert page.locator("#calc-split").inner_text().startswith("2×56 + 13 = 125 samples a step")
    calculate(page, 1000, 8, "balanced")
    assert page.locator("#calc-split").inner_text().startswith("2×42 + 41 = 125 samples a step")
    assert page.locator("#calc-reason").inner_text().startswith("balanced: the fewest")
    tab.screenshot("profile-calculator")


def test_the_calculator_shows_the_apis_refusal(
    tab: Tab, database: Database, reader: str, service: ServerThread
) -> None:
    profile = cuda_profile()
    (profile_id,) = store(database, [profile])
    page = signed_in(tab, reader).open(f"/profiles/{profile_id}")
    calculate(page, 100, 3, "max")
    refusal = recommendation(
        service,
        reader,
        workload=profile.workload_key,
        device=profile.device_key,
        global_batch_size=100,
        world_size=3,
    )
    assert refusal.status_code == 422
    message = refusal.json()["error"]["message"]
    assert "not divisible by world size 3" in message
    assert page.locator("#calc-error").inner_text() == message
    assert page.locator("#calc-result").count() == 0
    tab.screenshot("profile-calculator-error")


def test_an_older_profile_points_to_the_newest_that_the_calculator_uses(
    tab: Tab, database: Database, reader: str
) -> None:
    old, new = store(
        database,
        [sample_profile(max_micro_batch_size=8), sample_profile(max_micro_batch_size=12)],
    )
    page = signed_in(tab, reader).open(f"/profiles/{old}")
    assert page.locator("[data-status]").first.get_attribute("data-status") == "superseded"
    assert page.locator(f".notice a[href='/profiles/{new}']").count() == 1
    assert page.locator("#calc-answer").get_attribute("data-state") == "done"
    basis = page.locator("#calc-basis").inner_text()
    assert f"from profile #{new} (the newest of this workload and device)" in basis
    assert page.locator("#calc-micro").inner_text() == "12"


def test_a_profile_where_nothing_fits_explains_itself(
    tab: Tab, database: Database, reader: str
) -> None:
    (profile_id,) = store(database, [nothing_fits_profile()])
    page = signed_in(tab, reader).open(f"/profiles/{profile_id}")
    drawn = chart(page, "memory")
    assert [y for y in drawn["series"]["failed"] if y is not None] == [310 * 2**20]
    assert page.locator("[data-chart=throughput][data-empty]").count() == 1
    assert "nothing to recommend" in page.locator("#calculator").inner_text()
    assert page.locator("#calc-answer").get_attribute("data-state") == "none"  # never asked
    assert page.locator("#stat-mstar").inner_text() == "0"
    tab.screenshot("profile-nothing-fits")


def test_an_unknown_profile_is_a_404_page(tab: Tab, reader: str) -> None:
    tab.allow(r"status of 404")
    page = signed_in(tab, reader).open("/profiles/999")
    assert "no profile with id 999" in page.locator("#page-error").inner_text()
    response = page.goto(tab.base_url + "/profiles/999")
    assert response is not None
    assert response.status == 404


def test_a_chart_whose_data_cannot_be_read_says_why(
    tab: Tab, database: Database, reader: str
) -> None:
    (profile_id,) = store(database, [sample_profile(created_at=T0 + timedelta(days=1))])
    signed_in(tab, reader)
    tab.allow(r"status of 503")
    tab.page.route(
        f"**/api/v1/profiles/{profile_id}",
        lambda route: route.fulfill(
            status=503,
            content_type="application/json",
            body='{"error": {"code": "unavailable", "message": "the database is restarting"}}',
        ),
    )
    page = tab.open(f"/profiles/{profile_id}")
    page.wait_for_selector("#memory-chart[data-error]")
    assert "the database is restarting" in page.locator("#memory-chart").inner_text()
