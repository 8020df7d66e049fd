"""Every stored profile is answerable: no upload the schema accepts makes a question or a
page a 5xx. Hypothesis draws uploads over the fields that shape an answer (world size,
parallel mode, tp, a fake world, M* and its probes, the fit, the device's capacity) and,
for each it can, questions and dashboard pages about it; a real server on SQLite and
PostgreSQL. Uploads that contradict themselves on the mesh are refused at the field.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from api import migrate
from api.config import ServiceSettings
from api.db import Database
from api.main import create_app
from tests.api.conftest import fresh_postgres_database, make_token
from tests.api.documents import MiB, sample_profile
from tests.services import ServerThread
from tuner.core.plan import POLICIES

Document = dict[str, Any]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def http(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    def serve(url: str) -> Iterator[httpx.Client]:
        migrate.upgrade(url)
        database = Database(url)
        token = make_token(database, "admin", name="ada")
        database.dispose()
        with (
            ServerThread(create_app(ServiceSettings(database_url=url))) as server,
            httpx.Client(
                base_url=server.url,
                headers={"Authorization": f"Bearer {token}"},
                cookies={"tuner_token": token},
                timeout=30,
            ) as client,
        ):
            yield client

    if request.param == "sqlite":
        yield from serve(f"sqlite:///{tmp_path_factory.mktemp('answerable') / 'tuner.db'}")
    else:
        with fresh_postgres_database(request.getfixturevalue("postgres_server")) as url:
            yield from serve(url)


def _mesh_upload(world_size: int, tp: int) -> Document:
    document = sample_profile(workload_key="m" * 24, workload_name="meshy").model_dump(mode="json")
    document["world_size"] = world_size
    document["parallel"] = {"mode": "fsdp", "tp": tp, "tp_plan": "llama"}
    return document


@pytest.mark.parametrize(("world_size", "tp"), [(2, 4), (6, 4), (3, 2)])
def test_a_mesh_that_tp_does_not_divide_is_refused_at_the_field(
    http: httpx.Client, world_size: int, tp: int
) -> None:
    response = http.post("/api/v1/profiles", json=_mesh_upload(world_size, tp))
    assert response.status_code == 422, response.text
    (field,) = response.json()["error"]["fields"]
    assert field["location"] == ["body", "parallel", "tp"]
    assert f"world size {world_size} is not a multiple of tp {tp}" in field["message"]
    # Nothing was stored, and the pages that once fell over on such a row stand.
    assert http.get("/api/v1/workloads", params={"name": "meshy"}).json()["data"] == []
    assert http.get("/").status_code == 200


@st.composite
def upload(draw: st.DrawFn) -> Document:
    found = draw(st.integers(min_value=0, max_value=12))
    capacity = draw(st.sampled_from([1 * MiB, 200 * MiB, 2**40]))
    mode = draw(st.sampled_from(["none", "ddp", "fsdp"]))
    tp = draw(st.sampled_from([1, 2, 3, 4, 8]))
    document = sample_profile(
        max_micro_batch_size=found,
        workload_key=draw(st.sampled_from(["a" * 24, "b" * 24])),
        workload_name=draw(st.sampled_from(["alpha", "beta"])),
        device_key=draw(st.sampled_from(["c" * 24, "d" * 24])),
        device_name="cpu-x",
        capacity_bytes=capacity,
        # Its own time: a second document at a stored profile's time is a 409, not a profile.
        created_at=datetime(2026, 1, 1, tzinfo=UTC)
        + timedelta(seconds=draw(st.integers(0, 10**8))),
    ).model_dump(mode="json")
    document["world_size"] = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
    document["parallel"] = {
        "mode": mode,
        **({"tp": tp, "tp_plan": "llama"} if mode == "fsdp" and tp > 1 else {}),
    }
    document["settings"]["simulated_ranks"] = draw(st.booleans())
    if draw(st.booleans()):
        document["fit"] = None
    else:
        document["fit"] = {
            "fixed_bytes": draw(st.integers(min_value=0, max_value=2**40)),
            "bytes_per_sample": draw(st.integers(min_value=0, max_value=2**34)),
            "points": draw(st.integers(min_value=1, max_value=5)),
        }
    document["headroom"] = draw(st.sampled_from([0.0, 0.05, 0.5]))
    return document


@st.composite
def questions(draw: st.DrawFn, document: Document) -> list[dict[str, str]]:
    asked = []
    for _ in range(3):
        tp = draw(st.sampled_from([1, 2, 4]))
        dp = draw(st.sampled_from([1, 2, 3]))
        asked.append(
            {
                "workload": draw(
                    st.sampled_from([document["workload_key"], document["workload"]["name"]])
                ),
                "device": draw(st.sampled_from([document["device_key"], "cpu-x"])),
                "global_batch_size": str(dp * draw(st.sampled_from([1, 7, 64, 1000]))),
                "world_size": str(dp * tp),
                "tp": str(tp),
                "policy": draw(st.sampled_from(POLICIES)),
                **({"parallel": p} if (p := draw(st.sampled_from(["", "ddp", "fsdp"]))) else {}),
            }
        )
    return asked


@pytest.mark.slow
@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_accepted_upload_makes_a_question_or_a_page_a_5xx(
    http: httpx.Client, data: st.DataObject
) -> None:
    document = data.draw(upload())
    # Drawn before the upload: whether it is stored depends on what earlier examples stored.
    asked = data.draw(questions(document))
    created = http.post("/api/v1/profiles", json=document)
    assert created.status_code in (200, 201, 409, 422), created.text
    event(f"upload {created.status_code}")
    if created.status_code not in (200, 201):  # 200: the same document again
        return
    stored = created.json()
    for question in asked:
        response = http.get("/api/v1/recommendation", params=question)
        assert response.status_code < 500, (question, response.text)
        page = http.get("/", params=question)
        assert page.status_code < 500, question
    workloads = http.get("/api/v1/workloads", params={"limit": 100}).json()["data"]
    pages = [
        "/",
        "/profiles",
        "/profiles?latest=1",
        f"/profiles/{stored['id']}",
        "/workloads",
        "/devices",
        *(f"/workloads/{workload['id']}" for workload in workloads),
    ]
    for path in pages:
        assert http.get(path).status_code < 500, path
