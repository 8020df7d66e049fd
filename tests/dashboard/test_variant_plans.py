"""The explore table shows what decided, in Chromium at desktop and phone size: each
variant's plan for the exploration's global batch, its steps and its timed speed with the
spread of its rounds (from the speed curve its profile kept), the bars by that speed, and
the values equal to the API's."""

from __future__ import annotations

import httpx
import pytest

from api.dashboard.format import fmt_percent, fmt_rate
from api.db import Database
from tests.api.test_variants import explored
from tests.dashboard.conftest import VIEWPORTS, Tab, signed_in
from tests.dashboard.data import store
from tests.services import ServerThread
from tuner.core.speeds import SpeedCurve, TimedSize


def curve(per_sample: float, spread: float) -> SpeedCurve:
    """Micro batches of 1 to 9, timed for a per-rank batch of 32."""
    slowest = per_sample / (1 - spread)
    return SpeedCurve(
        sizes=[
            TimedSize(micro_batch_size=m, seconds_per_sample=[per_sample, slowest])
            for m in (1, 2, 4, 8, 9)
        ],
        optimizer_seconds=0.01,
        per_rank_batch_size=32,
    )


@pytest.mark.parametrize("viewport", list(VIEWPORTS))
def test_each_variant_shows_its_plan_steps_and_timed_speed(
    tab: Tab, database: Database, reader: str, service: ServerThread, viewport: str
) -> None:
    # As loaded fastest at M* yet slowest for the batch; bf16 (index 2) chosen by its plan.
    speeds = [curve(0.010, 0.02), curve(0.008, 0.05), curve(0.004, 0.03)]
    profiles = [
        p.model_copy(update={"speeds": s}) for p, s in zip(explored(chosen=2), speeds, strict=True)
    ]
    ids = store(database, profiles)
    with httpx.Client(base_url=service.url, headers={"Authorization": f"Bearer {reader}"}) as http:
        rows = http.get(f"/api/v1/profiles/{ids[0]}/variants").json()["data"]
    plans = {row["profile_id"]: row["plan"] for row in rows}
    assert all(plan["global_batch_size"] == 32 for plan in plans.values())

    width, height = VIEWPORTS[viewport]
    tab.page.set_viewport_size({"width": width, "height": height})
    page = signed_in(tab, reader).open(f"/profiles/{ids[0]}")
    assert "plan for the global batch of 32" in page.locator("#variants .hint").inner_text()
    for profile_id, plan in plans.items():
        row = page.locator(f"#variants tr[data-profile-id='{profile_id}']")
        steps = row.locator("[data-cell=steps]").inner_text()
        assert int(steps) == plan["grad_accum"]
        shown = row.locator("[data-cell=plan-speed]").inner_text()
        speed, spread = plan["samples_per_second"], plan["speed_spread"]
        assert shown == f"{fmt_rate(speed)} ±{fmt_percent(spread)}"

    # The bars are by the speed that decided: the chosen variant's is full.
    chosen = page.locator(f"#variants tr[data-profile-id='{ids[2]}'] rect.fill")
    assert chosen.get_attribute("width") == "100.0"
    # The profile's own timed speeds, each size with its spread.
    sizes = page.locator("#speeds tbody tr")
    assert sizes.count() == 5
    assert sizes.nth(0).inner_text().split() == ["1", fmt_rate(100.0), "±2%"]
    assert page.locator("[data-spread]").count() == 1  # the calculator's expected speed
    # Every column on screen at this width: the table scrolls inside its panel, the page not.
    assert page.evaluate("() => document.documentElement.scrollWidth") <= width
    tab.check()
