"""The memory timeline on the profile page, in Chromium at desktop and phone size, over
SQLite and PostgreSQL: the chart draws exactly the stored points (read back from uPlot's
own data), the phases are labelled and listed, the peak is written out, the keyboard reads
each point, and the download is a snapshot torch's ``_memory_viz`` reads. A profile stored
without a timeline says so."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page
from torch.cuda import _memory_viz

from api.dashboard.format import fmt_bytes
from api.db import Database
from tests.api.documents import sample_profile
from tests.dashboard.conftest import VIEWPORTS, Tab, signed_in
from tests.dashboard.data import store
from tests.timeline_profiles import measured_profile
from tuner.core.timeline import MemoryTimeline


@pytest.fixture(params=list(VIEWPORTS))
def viewport(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def opened(tab: Tab, database: Database, reader: str, viewport: str) -> tuple[Page, MemoryTimeline]:
    profile = measured_profile()
    probe = profile.probe_at(profile.max_micro_batch_size)
    assert probe is not None
    assert probe.timeline is not None
    (profile_id,) = store(database, [profile])
    width, height = VIEWPORTS[viewport]
    tab.page.set_viewport_size({"width": width, "height": height})
    page = signed_in(tab, reader).open(f"/profiles/{profile_id}")
    page.wait_for_selector("[data-timeline-chart][data-drawn]")
    return page, probe.timeline


def drawn(page: Page) -> dict[str, Any]:
    result: dict[str, Any] = page.evaluate(
        """() => {
          const u = window.tunerCharts.timeline;
          const el = document.querySelector('[data-timeline-chart]');
          return {x: u.data[0], y: u.data[1], phases: el.dataset.phases,
                  width: el.getBoundingClientRect().width, viewport: window.innerWidth,
                  overflow: document.documentElement.scrollWidth > window.innerWidth};
        }"""
    )
    return result


def test_the_chart_draws_the_stored_timeline_with_its_phases_and_peak(
    tab: Tab, database: Database, reader: str, viewport: str
) -> None:
    page, timeline = opened(tab, database, reader, viewport)
    chart = drawn(page)
    assert chart["x"] == timeline.position
    assert chart["y"] == timeline.live_bytes
    assert chart["phases"] == "F1 B1 F2 B2 O"
    assert not chart["overflow"]  # the phone's width holds the chart
    assert chart["width"] <= chart["viewport"]

    peak = page.locator("#timeline-peak")
    assert peak.get_attribute("data-peak-bytes") == str(timeline.peak_bytes)
    assert fmt_bytes(timeline.peak_bytes) in peak.inner_text()
    assert "the probe's allocated peak, to the byte" in peak.inner_text()
    assert timeline.peak_operator in peak.inner_text()

    rows = page.locator("#timeline-phases tbody tr")
    assert rows.count() == len(timeline.phases)
    peak_span = timeline.phase_at(timeline.peak_position)
    assert peak_span is not None
    marked = page.locator("#timeline-phases tr[data-peak]")
    assert marked.locator("th").inner_text() == peak_span.label
    assert "peak" in marked.inner_text()  # told in words, not only by a shade
    page.locator("#timeline-points summary").click()
    assert page.locator("#timeline-points tbody tr").count() == len(timeline.position)


def test_the_keyboard_reads_each_point(
    tab: Tab, database: Database, reader: str, viewport: str
) -> None:
    page, timeline = opened(tab, database, reader, viewport)
    chart = page.locator("[data-timeline-chart]")
    readout = page.locator("#timeline-readout")
    chart.focus()
    assert "the peak" in readout.inner_text()
    assert fmt_bytes(timeline.peak_bytes) in readout.inner_text()
    page.keyboard.press("Home")
    assert readout.inner_text().startswith(
        f"{timeline.unit} 0 · {fmt_bytes(timeline.live_bytes[0])}"
    )
    page.keyboard.press("ArrowRight")
    second = timeline.points()[1]
    assert readout.inner_text().startswith(
        f"{timeline.unit} {second[0]:,} · {fmt_bytes(second[1])}"
    )
    assert second[2] in readout.inner_text()
    page.keyboard.press("End")
    assert chart.get_attribute("data-cursor") == str(len(timeline.position) - 1)
    assert readout.inner_text().endswith("optimizer")
    page.keyboard.press("p")
    assert "the peak" in readout.inner_text()


def test_the_download_opens_in_torchs_memory_viz(
    tab: Tab, database: Database, reader: str, viewport: str, tmp_path: Path
) -> None:
    page, timeline = opened(tab, database, reader, viewport)
    with page.expect_download() as waiting:
        page.locator("#timeline-download").click()
    download = waiting.value
    assert download.suggested_filename.endswith("-memory-snapshot.pickle")
    path = tmp_path / download.suggested_filename
    download.save_as(path)
    data = pickle.loads(path.read_bytes())
    assert "segments: 1" in _memory_viz.segsum(data)
    assert "Active Memory Timeline" in _memory_viz.trace_plot(data)
    assert data["segments"][0]["total_size"] == timeline.peak_bytes


def test_a_profile_without_a_timeline_says_none_was_recorded(
    tab: Tab, database: Database, reader: str, viewport: str
) -> None:
    (profile_id,) = store(database, [sample_profile()])
    width, height = VIEWPORTS[viewport]
    tab.page.set_viewport_size({"width": width, "height": height})
    page = signed_in(tab, reader).open(f"/profiles/{profile_id}")
    assert "No timeline recorded" in page.locator("#timeline-none").inner_text()
    assert page.locator("[data-timeline-chart]").count() == 0
    assert page.locator("#timeline-download").count() == 0
