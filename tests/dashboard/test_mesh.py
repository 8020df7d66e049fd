"""The dashboard shows the mesh (dp × tp) wherever it tells runs apart, in the browser, on
the real service, from the real profiles of
``tests/data/mesh`` (``examples.mesh_mlp`` at six shapes, simulated ranks): the profile
list's badges, the profile page's simulated-ranks note, the landing calculator asking at
the newest profile's mesh, the workload page's series per tp, and a newer 4 × 1 run that
does not supersede the 2 × 2 mesh (recommendations pick by shape)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from api import models
from api.db import Database
from tests.core.test_mesh_worlds import load
from tests.dashboard.conftest import Tab, signed_in
from tests.dashboard.data import store
from tests.dashboard.test_world_sizes import drawn
from tuner.core.errors import BadInputError
from tuner.core.results import Profile
from tuner.core.shape import MeshShape
from tuner.core.worlds import estimate_world_size as at_world_size

# (W, tp), stored in this order: the 2 × 2 mesh is the newest.
ORDER = [(4, 1), (8, 1), (4, 4), (8, 4), (8, 2), (4, 2)]


def _store_each(database: Database, profiles: list[Profile]) -> list[int]:
    """One transaction each, so each is received after the one before."""
    return [store(database, [profile])[0] for profile in profiles]


def _estimated(profiles: list[Profile], world_size: int, tp: int) -> int | None:
    try:
        return at_world_size(profiles, MeshShape(world_size, tp)).max_micro_batch_size
    except BadInputError:
        return None


@pytest.mark.slow
def test_the_mesh_tells_runs_apart_on_every_page(tab: Tab, database: Database, reader: str) -> None:
    profiles = {shape: load(*shape) for shape in ORDER}
    ids = dict(zip(ORDER, _store_each(database, list(profiles.values())), strict=True))
    signed_in(tab, reader)

    # The list: a mesh badge on each mesh's row, none on the rows without one.
    page = tab.open("/profiles")
    for (world_size, tp), profile_id in ids.items():
        row = page.locator(f"tr[data-profile-id='{profile_id}']")
        mesh = row.locator("[data-run=mesh]")
        if tp == 1:
            assert mesh.count() == 0
        else:
            assert mesh.count() == 1
            assert mesh.inner_text() == f"{world_size // tp} × {tp} mesh"
            assert mesh.get_attribute("data-tp") == str(tp)
        # Each is the newest at its own shape: none is superseded.
        assert row.locator("[data-status]").get_attribute("data-status") != "superseded"
    assert page.locator(f"tr[data-profile-id='{ids[4, 2]}'] [data-run=mesh]").inner_text() == (
        "2 × 2 mesh"
    )
    assert page.locator(f"tr[data-profile-id='{ids[4, 4]}'] [data-run=mesh]").inner_text() == (
        "1 × 4 mesh"
    )

    # The profile page of a simulated run says so, and shows its mesh.
    page = tab.open(f"/profiles/{ids[4, 2]}")
    assert profiles[4, 2].settings.simulated_ranks
    assert page.locator("#simulated-ranks").get_attribute("data-simulated") == "true"
    assert page.locator("#run-badges [data-run=mesh]").inner_text() == "2 × 2 mesh"

    # The landing page, asked nothing, asks at the newest profile's mesh (2 × 2), where
    # that profile answers, measured; the answer line shows the mesh.
    page = tab.open("/")
    assert page.locator("#calc-world").input_value() == "4"
    assert page.locator("#calc-tp").input_value() == "2"
    answer: dict[str, Any] = page.evaluate(
        "() => JSON.parse(document.querySelector('#calc-result').dataset.answer)"
    )
    assert (answer["tp"], answer["profile_id"], answer["basis"]) == (2, ids[4, 2], "measured")
    line = page.locator(".answer-line")
    assert line.locator("[data-run=mesh]").inner_text() == "2 × 2 mesh"

    # The workload page: a series per tp, each measured point the profile at that shape,
    # each estimate line the recommendation's across every shape, where it answers.
    with database.session() as session:
        workload_id = session.query(models.Workload.id).scalar()
        device_id = session.query(models.Device.id).scalar()
    page = tab.open(f"/workloads/{workload_id}")
    chart = drawn(page, device_id)
    xs = chart["x"]
    assert xs == [1, 2, 4, 8, 16]  # powers of two to twice the largest measured, and those
    series = chart["series"]
    assert set(series) == {
        "fsdp-measured",
        "fsdp-estimated",
        "fsdp-tp2-measured",
        "fsdp-tp2-estimated",
        "fsdp-tp4-measured",
        "fsdp-tp4-estimated",
    }
    every = list(profiles.values())
    for tp, key in [(1, "fsdp"), (2, "fsdp-tp2"), (4, "fsdp-tp4")]:
        measured = {w: p.max_micro_batch_size for (w, t), p in profiles.items() if t == tp}
        assert series[f"{key}-measured"] == [measured.get(w) for w in xs]
        expected = [_estimated(every, w, tp) if w % tp == 0 else None for w in xs]
        assert series[f"{key}-estimated"] == expected
    # At W = 4 the three shapes differ, and none is drawn over another.
    at = xs.index(4)
    assert series["fsdp-measured"][at] == profiles[4, 1].max_micro_batch_size
    assert series["fsdp-tp2-measured"][at] == profiles[4, 2].max_micro_batch_size
    assert series["fsdp-tp4-measured"][at] == profiles[4, 4].max_micro_batch_size
    assert len({series[f"{k}-measured"][at] for k in ("fsdp", "fsdp-tp2", "fsdp-tp4")}) == 3
    # Estimated between the shapes measured (1 × 2), never past them (8 × 2).
    assert series["fsdp-tp2-estimated"][xs.index(2)] is not None
    assert series["fsdp-tp2-estimated"][xs.index(16)] is None
    labels = page.locator("#world-sizes h4[data-tp='2']").inner_text()
    assert labels.startswith("■ fsdp × tp 2")  # its marker's sign, then its name
    caption = page.locator("table.ranks[data-tp='2'][data-world-size='4'] caption")
    assert "2 × 2 mesh" in caption.inner_text()
    assert f"#{ids[4, 2]}" in caption.inner_text()
    tab.screenshot("workload-mesh")

    # A newer run at 4 × 1 supersedes the older 4 × 1, not the 2 × 2 mesh.
    newer = profiles[4, 1].model_copy(
        update={"created_at": profiles[4, 1].created_at + timedelta(hours=1)}
    )
    (newer_id,) = _store_each(database, [newer])
    page = tab.open("/profiles")

    def status(profile_id: int) -> str | None:
        badge = page.locator(f"tr[data-profile-id='{profile_id}'] [data-status]")
        return badge.get_attribute("data-status")

    assert status(ids[4, 1]) == "superseded"
    assert status(newer_id) != "superseded"
    assert status(ids[4, 2]) != "superseded"
    assert status(ids[4, 4]) != "superseded"
    page = tab.open("/profiles?latest=1")
    shown = {
        int(r)
        for r in page.locator("tr[data-profile-id]").evaluate_all(
            "rows => rows.map(r => r.dataset.profileId)"
        )
    }
    assert shown == (set(ids.values()) - {ids[4, 1]}) | {newer_id}
    page = tab.open(f"/profiles/{ids[4, 2]}")
    assert "A newer profile" not in page.locator("main").inner_text()
    assert page.locator("[data-status]").first.get_attribute("data-status") != "superseded"
    page = tab.open(f"/profiles/{ids[4, 1]}")
    assert "A newer profile" in page.locator("main").inner_text()
