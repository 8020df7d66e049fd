"""Profiles, devices and workloads over real HTTP, on SQLite and PostgreSQL: create, list
with filters and pages, read back with probes, and every bad input refused as a 422."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest

from api.config import ServiceSettings
from api.db import Database
from api.main import create_app
from tests.api.builders import at, error_of, upload
from tests.api.conftest import make_token
from tests.api.documents import MiB, sample_profile
from tests.services import ServerThread
from tuner.core.results import Profile
from tuner.core.wire.profiles import ProfileCreate


def _client(service: ServerThread, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=service.url, headers=headers, timeout=30)


def _stored(body: dict[str, Any]) -> dict[str, Any]:
    """The profile part of an answer, as the engine would print it."""
    document = {k: v for k, v in body.items() if k not in {"id", "workload_id", "device_id"}}
    return ProfileCreate.model_validate(document).model_dump(mode="json")


# Create and read back


@pytest.mark.slow
@pytest.mark.both_stores
def test_a_profile_is_stored_whole_and_read_back_with_its_probes(http: httpx.Client) -> None:
    profile = sample_profile()
    created = upload(http, profile)
    assert created["id"] >= 1
    assert {"workload_id", "device_id"} <= created.keys()
    assert created["workload_key"] == profile.workload_key
    assert created["device_key"] == profile.device_key
    assert _stored(created) == profile.model_dump(mode="json")

    fetched = http.get(f"/api/v1/profiles/{created['id']}")
    assert fetched.status_code == 200
    assert fetched.json() == created
    assert [p["micro_batch_size"] for p in fetched.json()["probes"]] == [1, 8, 9]


def test_the_engine_json_output_is_accepted_as_printed(http: httpx.Client) -> None:
    # `tuner profile --json` prints peak_bytes (derived) and recommendation keys; the
    # recommendation keys are the CLI's, the rest is the profile.
    document = sample_profile().model_dump(mode="json")
    assert "peak_bytes" in document["probes"][0]
    response = http.post("/api/v1/profiles", json=document)
    assert response.status_code == 201, response.text


@pytest.mark.both_stores
def test_the_same_profile_sent_twice_is_stored_once(http: httpx.Client) -> None:
    profile = sample_profile()
    first = upload(http, profile)
    again = http.post("/api/v1/profiles", json=profile.model_dump(mode="json"))
    assert again.status_code == 200
    assert again.json()["id"] == first["id"]
    assert http.get("/api/v1/profiles").json()["count"] == 1


@pytest.mark.both_stores
def test_a_different_profile_at_the_same_time_is_a_conflict(http: httpx.Client) -> None:
    profile = sample_profile()
    upload(http, profile)
    changed = profile.model_copy(update={"wall_time_s": 99.0})
    error = error_of(http.post("/api/v1/profiles", json=changed.model_dump(mode="json")), 409)
    assert "never replaced" in error["message"]


def test_devices_and_workloads_come_from_profiles_and_can_be_registered(
    http: httpx.Client,
) -> None:
    upload(http, sample_profile())
    devices = http.get("/api/v1/devices").json()
    assert devices["count"] == 1
    assert devices["data"][0]["key"] == "d" * 24
    assert devices["data"][0]["capacity_bytes"] == 200 * MiB
    device_id = devices["data"][0]["id"]
    assert http.get(f"/api/v1/devices/{device_id}").json()["name"] == "cpu-test"

    gpu = {"key": "g" * 24, "kind": "cuda", "name": "NVIDIA H100", "capacity_bytes": 80 * 2**30}
    created = http.post("/api/v1/devices", json=gpu)
    assert created.status_code == 201
    assert http.post("/api/v1/devices", json=gpu).status_code == 200  # registering again
    conflict = http.post("/api/v1/devices", json={**gpu, "capacity_bytes": 40 * 2**30})
    assert "registered already" in error_of(conflict, 409)["message"]
    assert http.get("/api/v1/devices", params={"kind": "cuda"}).json()["count"] == 1

    workloads = http.get("/api/v1/workloads").json()
    assert [w["name"] for w in workloads["data"]] == ["gpt-test"]
    workload = {
        "key": "v" * 24,
        "name": "vit",
        "precision": "bf16",
        "activation_checkpointing": True,
        "parameter_count": 86_000_000,
        "optimizer": "AdamW",
    }
    assert http.post("/api/v1/workloads", json=workload).status_code == 201
    assert http.post("/api/v1/workloads", json=workload).status_code == 200
    listed = http.get("/api/v1/workloads", params={"name": "vit"}).json()["data"]
    assert http.get(f"/api/v1/workloads/{listed[0]['id']}").json()["precision"] == "bf16"


def test_unknown_ids_are_404_with_where_to_look(http: httpx.Client) -> None:
    for resource in ("profiles", "devices", "workloads"):
        error = error_of(http.get(f"/api/v1/{resource}/12345"), 404)
        assert f"GET /api/v1/{resource}" in error["message"]


def test_ids_out_of_range_are_422(http: httpx.Client) -> None:
    for bad_id in ("0", "-1", "99999999999999999999", "abc"):
        error = error_of(http.get(f"/api/v1/profiles/{bad_id}"), 422)
        assert error["fields"][0]["location"] == ["path", "profile_id"], bad_id


# Filters and pages


@pytest.fixture
def history(http: httpx.Client) -> list[dict[str, Any]]:
    """Two workloads on two devices, three profiles each pair, at known times."""
    created = []
    for w, (workload_key, workload_name) in enumerate([("a" * 24, "gpt"), ("b" * 24, "cnn")]):
        for d, (device_key, device_name) in enumerate([("c" * 24, "cpu"), ("e" * 24, "gpu")]):
            for i in range(3):
                profile = sample_profile(
                    max_micro_batch_size=4 + i,
                    workload_key=workload_key,
                    workload_name=workload_name,
                    device_key=device_key,
                    device_name=device_name,
                    created_at=at(100 * i + 10 * w + d),
                )
                created.append(upload(http, profile))
    return created


def _ids(http: httpx.Client, **params: Any) -> list[int]:
    response = http.get("/api/v1/profiles", params={"limit": 500, **params})
    assert response.status_code == 200, response.text
    page = response.json()
    assert page["count"] == len(page["data"])
    return [row["id"] for row in page["data"]]


def _newest_first(rows: list[dict[str, Any]]) -> list[int]:
    """Received last first: the service's clock orders profiles, whatever the measuring
    machine's ``created_at`` says (ids grow in the order rows are received)."""
    return [r["id"] for r in sorted(rows, key=lambda r: r["id"], reverse=True)]


@pytest.mark.slow
@pytest.mark.both_stores
def test_filters_by_workload_device_and_time(
    http: httpx.Client, history: list[dict[str, Any]]
) -> None:
    assert _ids(http) == _newest_first(history)
    gpt = [p for p in history if p["workload"]["name"] == "gpt"]
    assert _ids(http, workload="gpt") == _newest_first(gpt)
    assert _ids(http, workload="a" * 24) == _newest_first(gpt)
    gpu = [p for p in history if p["device"]["name"] == "gpu"]
    assert _ids(http, device="gpu") == _newest_first(gpu)
    both = [p for p in gpt if p in gpu]
    assert _ids(http, workload="gpt", device="e" * 24) == _newest_first(both)
    middle = [p for p in history if at(50) < datetime.fromisoformat(p["created_at"]) < at(150)]
    assert len(middle) == 4
    after, before = at(50).isoformat(), at(150).isoformat()
    assert _ids(http, created_after=after, created_before=before) == _newest_first(middle)
    # A date alone, or a time without a zone, is UTC.
    assert _ids(http, created_after="2026-11-01T00:50:00", created_before=before) == (
        _newest_first(middle)
    )
    assert _ids(http, created_before="2026-11-01") == []
    assert _ids(http, workload="nothing-by-this-name") == []


@pytest.mark.slow
@pytest.mark.both_stores
def test_pages_cover_everything_once_in_order(
    http: httpx.Client, history: list[dict[str, Any]]
) -> None:
    # Profiles received in one instant would tie; ids break ties, so add some at once.
    for key in ("f", "h", "i"):
        history.append(upload(http, sample_profile(workload_key=key * 24, created_at=at(100))))
    expected = _newest_first(history)
    seen: list[int] = []
    token = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 4}
        if token:
            params["next_page_token"] = token
        page = http.get("/api/v1/profiles", params=params).json()
        assert page["count"] == len(expected) + pages  # the total, with those added below
        seen += [row["id"] for row in page["data"]]
        pages += 1
        token = page["next_page_token"]
        if token is None:
            break
        # A profile written while someone pages is newer than the cursor: it neither
        # repeats nor hides anything on later pages.
        upload(http, sample_profile(workload_key="z" * 24, created_at=at(1000 + pages)))
    assert seen == expected
    assert pages == -(-len(expected) // 4)


def test_page_token_is_accepted_under_either_name(
    http: httpx.Client, history: list[dict[str, Any]]
) -> None:
    first = http.get("/api/v1/profiles", params={"limit": 5}).json()
    token = first["next_page_token"]
    by_next = http.get("/api/v1/profiles", params={"limit": 5, "next_page_token": token})
    by_page = http.get("/api/v1/profiles", params={"limit": 5, "page_token": token})
    assert by_next.json() == by_page.json()
    assert {r["id"] for r in by_next.json()["data"]}.isdisjoint(r["id"] for r in first["data"])


# Each case is one request against one service: cheaper than a fresh database each.
BAD_LIST_PARAMETERS: list[tuple[dict[str, Any], str]] = [
    ({"next_page_token": "garbage"}, "next_page_token"),
    ({"next_page_token": "eyJjIjogMX0"}, "next_page_token"),  # {"c": 1}
    ({"page_token": "!!!"}, "page_token"),
    ({"limit": 0}, "limit"),
    ({"limit": 501}, "limit"),
    ({"limit": "many"}, "limit"),
    ({"created_after": "yesterday"}, "created_after"),
    ({"workload": ""}, "workload"),
    ({"workload": "x\x00y"}, "workload"),
    ({"sort": "name"}, "sort"),
]


def test_bad_list_parameters_are_field_level_422(http: httpx.Client) -> None:
    for params, location in BAD_LIST_PARAMETERS:
        error = error_of(http.get("/api/v1/profiles", params=params), 422)
        assert error["code"] == "bad_input"
        assert ["query", location] in [f["location"] for f in error["fields"]], params


def test_a_forged_token_from_other_data_is_refused(http: httpx.Client) -> None:
    import base64

    forged = base64.urlsafe_b64encode(json.dumps({"c": "2026-01-01", "i": 5}).encode())
    error = error_of(http.get("/api/v1/profiles", params={"page_token": forged.decode()}), 422)
    assert "leave it out to start from the first page" in error["message"]


# Bad profiles


def _document(**changes: Any) -> dict[str, Any]:
    document = sample_profile().model_dump(mode="json")
    for path, value in changes.items():
        target = document
        *parents, last = path.split("__")
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[last] = value
    return document


BAD_PROFILES: list[tuple[dict[str, Any], list[str]]] = [
    ({"bogus": 1}, ["body", "bogus"]),
    ({"probes__0__bogus": 1}, ["body", "probes", "0", "bogus"]),
    ({"device__capacity_bytes": 0}, ["body", "device", "capacity_bytes"]),
    ({"device__capacity_bytes": -5}, ["body", "device", "capacity_bytes"]),
    ({"device__capacity_bytes": 2**64}, ["body", "device", "capacity_bytes"]),
    ({"probes__0__micro_batch_size": 0}, ["body", "probes", "0", "micro_batch_size"]),
    ({"probes__0__peak_reserved_bytes": -1}, ["body", "probes", "0", "peak_reserved_bytes"]),
    ({"size_cap": 2**40}, ["body", "size_cap"]),
    ({"headroom": 1.5}, ["body", "headroom"]),
    ({"workload_key": "k" * 65}, ["body", "workload_key"]),
    ({"device_key": "has space"}, ["body", "device_key"]),
    ({"workload__name": "x" * 201}, ["body", "workload", "name"]),
    ({"workload__precision": "float32-x"}, ["body", "workload", "precision"]),
    ({"device__name": "nul\x00byte"}, ["body", "device", "name"]),
    ({"created_at": "2026-11-01T00:00:00"}, ["body", "created_at"]),
    ({"device__details": {"nested": {"a": 1}}}, ["body", "device", "details", "nested"]),
    ({"probes": "not a list"}, ["body", "probes"]),
]


def test_bad_profiles_are_field_level_422_and_store_nothing(http: httpx.Client) -> None:
    for changes, location in BAD_PROFILES:
        error = error_of(http.post("/api/v1/profiles", json=_document(**changes)), 422)
        locations = [f["location"][: len(location)] for f in error["fields"]]
        assert location in locations, (changes, error)
    assert http.get("/api/v1/profiles").json()["count"] == 0


# What the stdlib JSON parser accepts but no database can store.
UNSTORABLE_JSON = [b'"headroom": NaN', b'"wall_time_s": Infinity', b'"strategy": "\\ud800"']


def test_json_that_parses_but_cannot_be_stored_is_422(http: httpx.Client) -> None:
    document = json.dumps(_document()).encode()
    for raw in UNSTORABLE_JSON:
        key = raw.split(b":")[0]
        start = document.index(key)
        end = document.index(b",", start)
        body = document[:start] + raw + document[end:]
        response = http.post(
            "/api/v1/profiles", content=body, headers={"Content-Type": "application/json"}
        )
        error_of(response, 422)
    assert http.get("/api/v1/profiles").json()["count"] == 0


def test_a_body_that_is_not_json_is_refused_without_a_crash(http: httpx.Client) -> None:
    response = http.post(
        "/api/v1/profiles", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422


def test_bodies_over_one_mib_are_413_whether_declared_or_streamed(http: httpx.Client) -> None:
    """Content-Length over the limit is refused before reading; a chunked body (no length
    given) is counted while it streams. Either way nothing is stored."""
    padding = {"message": "x" * (1024 * 1024)}
    declared = http.post("/api/v1/oom-reports", json=padding)
    assert error_of(declared, 413)["code"] == "payload_too_large"

    def chunks(total: int) -> Iterator[bytes]:
        yield b'{"message": "'
        for _ in range(total // 65536):
            yield b"y" * 65536
        yield b'"}'

    streamed = http.post(
        "/api/v1/oom-reports",
        content=chunks(2 * 1024 * 1024),
        headers={"Content-Type": "application/json"},
    )
    assert error_of(streamed, 413)["code"] == "payload_too_large"
    # A chunked body under the limit is read whole and judged on its content.
    small = http.post(
        "/api/v1/oom-reports", content=chunks(0), headers={"Content-Type": "application/json"}
    )
    assert small.status_code == 422
    assert http.get("/api/v1/profiles").json()["count"] == 0


# Tokens


@pytest.fixture
def tokens(database: Database) -> dict[str, str]:
    return {scope: make_token(database, scope, name=scope) for scope in ("read", "write", "worker")}


def test_reads_and_writes_need_the_right_token(
    service: ServerThread, tokens: dict[str, str]
) -> None:
    document = sample_profile().model_dump(mode="json")
    with _client(service, None) as anonymous:
        error = error_of(anonymous.get("/api/v1/profiles"), 401)
        assert "Authorization: Bearer" in error["message"]
        error_of(anonymous.post("/api/v1/profiles", json=document), 401)
        error_of(anonymous.get("/api/v1/recommendation"), 401)
    with _client(service, "mbt_not-a-real-token") as forged:
        error_of(forged.get("/api/v1/profiles"), 401)
    with _client(service, tokens["read"]) as reader:
        assert reader.get("/api/v1/profiles").status_code == 200
        error = error_of(reader.post("/api/v1/profiles", json=document), 403)
        assert "'write or worker'" in error["message"]
    with _client(service, tokens["worker"]) as worker:
        assert worker.post("/api/v1/profiles", json=document).status_code == 201
        oom = {"workload": "gpt-test", "device": "cpu-test", "micro_batch_size": 4}
        error_of(worker.post("/api/v1/oom-reports", json=oom), 403)
    with _client(service, tokens["write"]) as writer:
        again = writer.post("/api/v1/profiles", json=document)
        assert again.status_code == 200
        assert writer.post("/api/v1/oom-reports", json=oom).status_code == 201


@pytest.fixture
def public_service(migrated_url: str) -> Iterator[ServerThread]:
    app = create_app(ServiceSettings(database_url=migrated_url, public_reads=True))
    with ServerThread(app) as server:
        yield server


def test_public_reads_answer_gets_without_a_token_but_never_writes(
    public_service: ServerThread, database: Database
) -> None:
    token = make_token(database, "write")
    with _client(public_service, token) as writer:
        upload(writer, sample_profile())
    with _client(public_service, None) as anonymous:
        assert anonymous.get("/api/v1/profiles").json()["count"] == 1
        assert anonymous.get("/api/v1/devices").status_code == 200
        answer = anonymous.get(
            "/api/v1/recommendation",
            params={"workload": "gpt-test", "device": "cpu-test", "global_batch_size": 16},
        )
        assert answer.status_code == 200
        document = sample_profile(max_micro_batch_size=3).model_dump(mode="json")
        error_of(anonymous.post("/api/v1/profiles", json=document), 401)
        # The answer is cached now; a dashboard cookie with a bad token is still checked.
        anonymous.cookies.set("tuner_token", "mbt_" + "0" * 43)
        refused = anonymous.get("/api/v1/recommendation", params=answer.request.url.params)
        error_of(refused, 401)


def test_the_openapi_document_lists_every_resource(http: httpx.Client) -> None:
    paths = http.get("/openapi.json").json()["paths"]
    for path in (
        "/api/v1/devices",
        "/api/v1/devices/{device_id}",
        "/api/v1/workloads",
        "/api/v1/workloads/{workload_id}",
        "/api/v1/profiles",
        "/api/v1/profiles/{profile_id}",
        "/api/v1/recommendation",
        "/api/v1/oom-reports",
    ):
        assert path in paths


def _ddp_profile_at_two_ranks() -> Profile:
    from tuner.core.parallel import Parallel

    base = sample_profile()
    probes = [
        probe.model_copy(
            update={
                "rank_peaks_bytes": [probe.peak_reserved_bytes, probe.peak_reserved_bytes - 1],
                "rank_breakdowns": [probe.breakdown, probe.breakdown],
            }
        )
        for probe in base.probes
    ]
    return base.model_copy(
        update={
            "world_size": 2,
            "parallel": Parallel(mode="ddp", bucket_cap_mb=10.0),
            "probes": probes,
        }
    )


@pytest.mark.both_stores
def test_a_profile_measured_on_several_ranks_is_stored_with_its_ranks(
    http: httpx.Client,
) -> None:
    document = _ddp_profile_at_two_ranks()
    stored = upload(http, document)
    again = http.get(f"/api/v1/profiles/{stored['id']}").json()
    assert (
        Profile.model_validate(
            {k: v for k, v in again.items() if k not in ("id", "workload_id", "device_id")}
        )
        == document
    )
    [summary] = http.get("/api/v1/profiles").json()["data"]
    assert (summary["world_size"], summary["parallel_mode"]) == (2, "ddp")


def test_a_probe_with_a_peak_per_rank_for_another_world_size_is_refused(
    http: httpx.Client,
) -> None:
    document = _ddp_profile_at_two_ranks().model_copy(update={"world_size": 3})
    response = http.post("/api/v1/profiles", json=document.model_dump(mode="json"))
    assert response.status_code == 422
    assert "lists 2 rank_peaks_bytes for world size 3" in response.text
    assert http.get("/api/v1/profiles").json()["count"] == 0
