"""A workload's M* against world size in the browser: the chart draws the measured points
of each parallel mode (read back from uPlot's own data) and the estimate line that
tuner.core.worlds gives, the per-rank breakdown at M* is listed, and a workload only
ever run in one process shows none of it."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from playwright.sync_api import Page

from api.dashboard.format import fmt_bytes
from api.db import Database
from tests.api.documents import MiB, sample_probe, sample_profile
from tests.dashboard.conftest import Tab, signed_in
from tests.dashboard.data import T0, store
from tests.helpers import scaled
from tuner.core import worlds
from tuner.core.parallel import Parallel
from tuner.core.results import MemoryBreakdown, Profile
from tuner.core.shape import MeshShape

DDP_KEY = "ddp".ljust(24, "w")


def ddp_profile(world_size: int) -> Profile:
    """Peaks of ``100 MiB + 40 MiB / W + 10 MiB·m`` on each of ``W`` ranks (the last rank
    1 MiB lower); M* is where that reaches the 190 MiB budget."""
    fixed = 100 * MiB + 40 * MiB // world_size
    found = (190 * MiB - fixed) // (10 * MiB)
    base = sample_profile(
        max_micro_batch_size=found,
        workload_key=DDP_KEY,
        created_at=T0 + timedelta(hours=world_size),
    )
    probes = []
    for m in (found - 1, found, found + 1):
        probe = sample_probe(m, fits=m <= found, fixed=fixed)
        peak = probe.peak_reserved_bytes or 0
        parts = MemoryBreakdown(
            parameters_bytes=fixed // 4,
            gradients_bytes=fixed // 4,
            optimizer_state_bytes=fixed // 2,
            activations_bytes=10 * MiB * m,
            communication_bytes=MiB * world_size,
        )
        probes.append(
            probe.model_copy(
                update={
                    "rank_peaks_bytes": [peak] * (world_size - 1) + [peak - MiB],
                    "rank_breakdowns": [parts] * world_size,
                }
            )
        )
    return base.model_copy(
        update={"probes": probes, "world_size": world_size, "parallel": Parallel(mode="ddp")}
    )


def drawn(page: Page, device_id: int) -> dict[str, Any]:
    page.wait_for_selector(f"[data-worlds-chart='{device_id}'][data-drawn]")
    result: dict[str, Any] = page.evaluate(
        """id => {
          const u = window.tunerCharts["worlds-" + id];
          const keys = JSON.parse(u.root.parentElement.dataset.series);
          return {x: u.data[0], series: Object.fromEntries(keys.map((k, i) => [k, u.data[i + 1]]))};
        }""",
        device_id,
    )
    return result


@pytest.mark.slow
def test_m_star_against_world_size_per_mode_with_ranks(
    tab: Tab, database: Database, reader: str
) -> None:
    one = sample_profile(max_micro_batch_size=8)  # the same model, in one process
    two, four = ddp_profile(2), ddp_profile(4)
    one_id, two_id, four_id = store(database, [one, two, four])
    with database.session() as session:
        from api import models

        workload_id = session.query(models.Workload.id).filter_by(key=DDP_KEY).scalar()
        device_id = session.query(models.Device.id).scalar()

    page = signed_in(tab, reader).open(f"/workloads/{workload_id}")
    chart = drawn(page, device_id)
    xs = chart["x"]
    # Powers of two to twice the largest world size measured, and the sizes measured:
    # the fit is asked only where the chart draws.
    assert xs == [1, 2, 4, 8]
    series = chart["series"]
    assert set(series) == {"none-measured", "ddp-measured", "ddp-estimated"}
    assert series["none-measured"] == [8, None, None, None]
    assert series["ddp-measured"] == [
        {2: two.max_micro_batch_size, 4: four.max_micro_batch_size}.get(w) for w in xs
    ]
    expected = [
        worlds.estimate_world_size([two, four], MeshShape(w)).max_micro_batch_size for w in xs
    ]
    assert series["ddp-estimated"] == expected
    assert (
        expected[3]
        == worlds.estimate_world_size([two, four], MeshShape(8)).max_micro_batch_size
        >= 1
    )

    # Each rank's peak and breakdown at M*, for each world size measured.
    table = page.locator("table.ranks[data-mode=ddp][data-world-size='4']")
    rows = table.locator("tbody tr").all_inner_texts()
    assert len(rows) == 4
    at_max = four.probe_at(four.max_micro_batch_size)
    assert at_max is not None
    last = rows[-1].split("\t")
    assert last[:2] == ["3", fmt_bytes(at_max.rank_peaks_bytes[-1])]
    assert last[5] == fmt_bytes(4 * MiB)  # communication
    assert f"#{four_id}" in table.inner_text()
    assert f"#{two_id}" in page.locator("table.ranks[data-world-size='2']").inner_text()
    assert f"#{one_id}" in page.locator("#world-sizes").inner_text()
    tab.screenshot("workload-world-sizes")


def test_a_workload_only_run_in_one_process_has_no_world_size_chart(
    tab: Tab, database: Database, reader: str
) -> None:
    store(database, [sample_profile(max_micro_batch_size=8)])
    with database.session() as session:
        from api import models

        workload_id = session.query(models.Workload.id).scalar()
    page = signed_in(tab, reader).open(f"/workloads/{workload_id}")
    page.wait_for_selector(".device-card")
    assert page.locator("#world-sizes").count() == 0


def test_a_large_world_is_estimated_only_where_the_chart_draws(
    tab: Tab, database: Database, reader: str
) -> None:
    """Measured at W = 2 and 512 (a fake world's size), the chart draws to 1,024 and the
    fit is asked at the powers of two and the measured sizes only: 11 sizes, where every
    world size up to 1,024 was asked before (the page took 3.9-6.5 s for such a workload)."""
    big, small = ddp_profile(512), ddp_profile(2)
    big = big.model_copy(
        update={
            "probes": [
                p.model_copy(update={"rank_peaks_bytes": [], "rank_breakdowns": []})
                for p in big.probes
            ]
        }
    )
    store(database, [small, big])
    with database.session() as session:
        from api import models

        workload_id = session.query(models.Workload.id).filter_by(key=DDP_KEY).scalar()
        device_id = session.query(models.Device.id).scalar()
    started = time.perf_counter()
    page = signed_in(tab, reader).open(f"/workloads/{workload_id}")
    seconds = time.perf_counter() - started
    chart = drawn(page, device_id)
    assert chart["x"] == [1 << k for k in range(11)]
    estimated = [v for v in chart["series"]["ddp-estimated"] if v is not None]
    assert 1 <= len(estimated) <= 11
    print(f"workload page with W = 2 and 512 measured: {seconds * 1000:.0f} ms")
    assert seconds < scaled(2.0)  # 3.9-6.5 s before (on a quiet machine)
