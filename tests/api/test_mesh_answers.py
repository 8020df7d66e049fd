"""The service answers by mesh shape (dp × tp), on a real service over SQLite and over
PostgreSQL, from real profiles: measured where a profile at that shape exists, estimated
across the shapes measured (the same numbers as ``tuner.core.worlds``), refused in one
line where it would extrapolate; ``tp`` goes through the Python client (REST and
embedded) and the answer cache. And migration 0013 (``profiles.tp``) both ways.

The profiles are ``tests/data/mesh``'s: ``tuner profile examples.mesh_mlp:workload
--fake-world`` at each shape (see ``tests/core/test_mesh_worlds.py`` for the command).
"""

from __future__ import annotations

import html
import json
from typing import Any

import httpx
import pytest
from sqlalchemy import inspect

from api import migrate
from api.db import create_db_engine
from tests.api.builders import error_of
from tests.api.migration_rows import query, rows_before_0004
from tests.core.test_mesh_worlds import FITTED, HELD_OUT, MESH, load
from tests.services import ServerThread
from tuner.client import TunerClient
from tuner.core import worlds
from tuner.core.errors import BadInputError, NotFoundError
from tuner.core.parallel import SIMULATED_RANKS_NOTE
from tuner.core.shape import MeshShape

BATCH = 1024  # divisible by every dp here


def _document(world_size: int, tp: int) -> dict[str, Any]:
    """The profile as ``tuner profile --json`` printed it (its advice too)."""
    document: dict[str, Any] = json.loads(
        (MESH / f"mesh_mlp_w{world_size}_tp{tp}.json").read_text()
    )
    return document


def _upload(http: httpx.Client, world_size: int, tp: int) -> int:
    response = http.post("/api/v1/profiles", json=_document(world_size, tp))
    assert response.status_code in (200, 201), response.text
    profile_id: int = response.json()["id"]
    return profile_id


def _ask(http: httpx.Client, world_size: int, tp: int | None, **extra: Any) -> httpx.Response:
    held = load(*HELD_OUT)
    params: dict[str, Any] = {
        "workload": held.workload_key,
        "device": held.device_key,
        "global_batch_size": BATCH,
        "world_size": world_size,
        "parallel": "fsdp",
        **extra,
    }
    if tp is not None:
        params["tp"] = tp
    return http.get("/api/v1/recommendation", params=params)


def test_answers_by_mesh_shape_measured_estimated_refused(http: httpx.Client) -> None:
    ids = {shape: _upload(http, *shape) for shape in FITTED}
    fitted = [load(*shape) for shape in FITTED]

    # Estimated at the 2 × 2 mesh: what the core's fit says, with its error.
    expected = worlds.estimate_world_size(fitted, MeshShape(4, 2))
    response = _ask(http, 4, 2)
    assert response.status_code == 200, response.text
    estimated = response.json()
    assert estimated["basis"] == "estimated"
    assert estimated["max_micro_batch_size"] == expected.max_micro_batch_size
    assert estimated["expected_error"] == pytest.approx(expected.fit.max_relative_error)
    assert sorted(estimated["based_on_profiles"]) == sorted(ids.values())
    assert estimated["tp"] == 2
    # global batch = micro batch × grad accum × dp, dp = 4 / 2
    assert estimated["per_rank_batch_size"] == BATCH // 2
    assert sum(size * count for size, count in estimated["split"]) == BATCH // 2
    assert estimated["max_micro_batch_size"] <= load(*HELD_OUT).max_micro_batch_size

    # The same world size without a mesh is measured: (4, 1) has a profile.
    flat = _ask(http, 4, None).json()
    assert flat["basis"] == "measured"
    assert flat["profile_id"] == ids[4, 1]
    assert (flat["profile_tp"], flat["tp"], flat["per_rank_batch_size"]) == (1, 1, BATCH // 4)
    assert _ask(http, 4, 1).json()["profile_id"] == ids[4, 1]  # tp=1 is the default

    # Measured at (4, 2) (W 8, tp 2), whose own profile answers.
    at_8_2 = _ask(http, 8, 2).json()
    assert at_8_2["basis"] == "measured"
    assert (at_8_2["profile_id"], at_8_2["profile_world_size"], at_8_2["profile_tp"]) == (
        ids[8, 2],
        8,
        2,
    )
    assert at_8_2["max_micro_batch_size"] == load(8, 2).max_micro_batch_size

    # Refused in one line where it would extrapolate.
    for world_size, tp, words in [
        (16, 2, "no measured mesh is at least 8 × 2"),
        (8, 8, "outside the measured dp"),
    ]:
        error = error_of(_ask(http, world_size, tp), 422)
        assert words in error["message"]
        assert "\n" not in error["message"]

    # A world size tp does not divide, and a batch dp does not divide: field-level 422s.
    error = error_of(_ask(http, 6, 4), 422)
    assert error["fields"][0]["location"] == ["query", "world_size"]
    assert "not a multiple of tp 4" in error["message"]
    odd = error_of(_ask(http, 8, 2, global_batch_size=6), 422)
    assert "not divisible by the 4 data-parallel groups" in odd["message"]
    # A mesh asked of a run without FSDP.
    assert "runs under fsdp" in error_of(_ask(http, 4, 2, parallel="ddp"), 422)["message"]

    # Once the 2 × 2 mesh is measured, it answers (the cached estimate is not kept).
    held_id = _upload(http, *HELD_OUT)
    measured = _ask(http, 4, 2).json()
    assert measured["basis"] == "measured"
    assert (measured["profile_id"], measured["profile_tp"]) == (held_id, 2)
    assert measured["max_micro_batch_size"] == load(*HELD_OUT).max_micro_batch_size
    assert measured["max_micro_batch_size"] >= estimated["max_micro_batch_size"]

    # The dashboard shows the mesh where it shows the world size, the note of a simulated
    # world, and a calculator that asks with tp.
    page = http.get(f"/profiles/{held_id}")
    assert page.status_code == 200, page.text
    assert 'data-run="mesh" data-tp="2"' in page.text
    assert "2 × 2 mesh" in page.text
    assert 'id="simulated-ranks"' in page.text
    assert SIMULATED_RANKS_NOTE.capitalize() in html.unescape(page.text)
    assert 'id="calc-tp" name="tp"' in page.text
    assert 'value="2"' in page.text.split('id="calc-tp"')[1].split(">")[0]
    flat_page = http.get(f"/profiles/{ids[4, 1]}").text
    assert 'data-run="mesh"' not in flat_page.split('id="calc-form"')[0]


def test_the_client_asks_by_mesh_shape_over_rest_and_embedded(
    service: ServerThread, admin_token: str, migrated_url: str
) -> None:
    held = load(*HELD_OUT)
    question = {
        "workload": held.workload_key,
        "device": held.device_key,
        "global_batch_size": BATCH,
        "world_size": 4,
        "parallel": "fsdp",
    }
    with TunerClient(service.url, token=admin_token) as rest:
        for shape in FITTED:
            rest.upload_profile(_document(*shape))
        over_rest = rest.recommend(**question, tp=2)
        assert over_rest.basis == "estimated"
        assert over_rest.tp == 2
        assert rest.recommend(**question).basis == "measured"  # (4, 1)
        with pytest.raises(BadInputError, match="no measured mesh is at least 8 × 2"):
            rest.recommend(**{**question, "world_size": 16}, tp=2)
    with TunerClient(migrated_url) as embedded:
        same = embedded.recommend(**question, tp=2)
        assert same.model_dump(exclude={"profile_age_s"}) == over_rest.model_dump(
            exclude={"profile_age_s"}
        )
        with pytest.raises((BadInputError, NotFoundError)):
            embedded.recommend(**{**question, "world_size": 16}, tp=2)


def _schema(url: str) -> tuple[set[str], set[str]]:
    """The profiles table's columns and index names."""
    engine = create_db_engine(url)
    try:
        found = inspect(engine)
        columns = {column["name"] for column in found.get_columns("profiles")}
        indexes = {str(index["name"]) for index in found.get_indexes("profiles")}
    finally:
        engine.dispose()
    return columns, indexes


@pytest.mark.both_stores  # a revision's rows: the store is the subject
def test_migration_0013_adds_tp_and_goes_back(database_url: str) -> None:
    """Rows stored before are of no mesh (tp 1); going back drops the column and restores
    the index by world size alone; the profiles and probes stay."""
    migrate.upgrade(database_url, "0003")
    rows_before_0004(database_url)
    migrate.upgrade(database_url, "0012")
    migrate.upgrade(database_url, "0013")
    assert query(database_url, "SELECT id, tp FROM profiles ORDER BY id") == [(1, 1)]
    columns, indexes = _schema(database_url)
    assert "tp" in columns
    assert "ix_profiles_workload_device_world_tp_received" in indexes
    assert "ix_profiles_workload_device_world_received" not in indexes

    migrate.downgrade(database_url, "0012")
    columns, indexes = _schema(database_url)
    assert "tp" not in columns
    assert "ix_profiles_workload_device_world_received" in indexes
    assert query(database_url, "SELECT COUNT(*) FROM probes") == [(1,)]
    migrate.upgrade(database_url)
    assert migrate.current_revision(database_url) == migrate.head_revision()
