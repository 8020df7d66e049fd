"""GET /api/v1/recommendation in the service (in process): each policy, the
newest profile counting, estimates for a device never profiled, OOM reports lowering the
answer until a newer profile, and every bad request refused with what is allowed."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.api.builders import at, error_of, profile_with_speeds, recommendation, upload
from tests.api.documents import MiB, sample_profile
from tuner.core.wire.recommendation import MAX_FLAT_SPLIT, MAX_GLOBAL_BATCH_SIZE

# Measured samples per second by size: 12 is M*, 10 is within 5% of 12, 8 is the fastest.
SPEEDS = {1: 10.0, 4: 60.0, 8: 110.0, 10: 96.0, 12: 100.0}


@pytest.fixture
def measured(http: httpx.Client) -> dict[str, Any]:
    profile = profile_with_speeds(
        SPEEDS, max_micro_batch_size=12, capacity_bytes=400 * MiB, created_at=at(0)
    )
    return upload(http, profile)


def _ok(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


@pytest.mark.parametrize(
    ("policy", "micro", "split"),
    [
        ("balanced", 10, [[10, 4]]),
        ("max", 12, [[12, 3], [4, 1]]),
        ("even", 10, [[10, 4]]),
        ("throughput", 8, [[8, 5]]),
    ],
)
def test_each_policy_over_one_measured_profile(
    http: httpx.Client,
    measured: dict[str, Any],
    policy: str,
    micro: int,
    split: list[list[int]],
) -> None:
    answer = _ok(recommendation(http, global_batch_size=80, world_size=2, policy=policy))
    assert answer["micro_batch_size"] == micro
    assert answer["split"] == split  # runs [size, count]
    assert answer["grad_accum"] == sum(count for _, count in split)
    assert sum(size * count for size, count in split) * 2 == 80
    assert answer["per_rank_batch_size"] == 40
    assert answer["policy"] == policy
    assert answer["reason"].startswith(f"{policy}: ")
    assert answer["basis"] == "measured"
    peak = (100 + 10 * micro) * MiB  # the sample probes' footprint
    assert answer["expected_peak_bytes"] == peak
    assert answer["expected_headroom_bytes"] == 400 * MiB - peak
    assert answer["expected_samples_per_second"] == SPEEDS[micro]
    assert answer["profile_id"] == measured["id"]
    assert answer["profile_device_key"] == answer["device_key"] == "d" * 24
    assert answer["profile_created_at"] == "2026-11-01T00:00:00Z"
    assert answer["profile_age_s"] > 0
    assert answer["capacity_bytes"] == 400 * MiB
    assert answer["oom_limit"] is None


def test_workload_and_device_by_key_or_name_agree(
    http: httpx.Client, measured: dict[str, Any]
) -> None:
    by_name = _ok(recommendation(http, global_batch_size=48))
    by_key = _ok(recommendation(http, global_batch_size=48, workload="w" * 24, device="d" * 24))
    assert {**by_name, "profile_age_s": 0} == {**by_key, "profile_age_s": 0}
    assert by_name["split"] == [[12, 4]]


def test_the_profile_received_last_counts_whatever_its_machine_clock_says(
    http: httpx.Client, measured: dict[str, Any]
) -> None:
    first = upload(http, sample_profile(max_micro_batch_size=6, created_at=at(10)))
    assert _ok(recommendation(http, global_batch_size=12))["profile_id"] == first["id"]
    # Stamped earlier by its machine, received later: the service's clock decides (a
    # machine's clock can be off by hours; see test_clocks.py).
    last = upload(http, sample_profile(max_micro_batch_size=20, created_at=at(5)))
    answer = _ok(recommendation(http, global_batch_size=12))
    assert answer["profile_id"] == last["id"]
    assert answer["split"] == [[12, 1]]


def test_a_device_never_profiled_gets_an_estimate_from_another_devices_fit(
    http: httpx.Client, measured: dict[str, Any]
) -> None:
    big = {"key": "g" * 24, "kind": "cuda", "name": "big-gpu", "capacity_bytes": 800 * MiB}
    assert http.post("/api/v1/devices", json=big).status_code == 201
    # fit: 100 MiB + 10 MiB per sample; budget 95% of 800 MiB = 760 MiB -> 66 samples,
    # and 128 in two balanced micro batches of 64.
    for device in ("big-gpu", "g" * 24):
        answer = _ok(recommendation(http, device=device, global_batch_size=128))
        assert answer["basis"] == "estimated"
        assert answer["max_micro_batch_size"] == 66
        assert answer["split"] == [[64, 2]]
        assert answer["expected_peak_bytes"] == (100 + 10 * 64) * MiB
        assert answer["expected_headroom_bytes"] == 800 * MiB - (100 + 10 * 64) * MiB
        assert answer["expected_samples_per_second"] is None  # speed does not carry over
        assert answer["device_key"] == "g" * 24
        assert answer["profile_device_key"] == "d" * 24
        assert answer["profile_id"] == measured["id"]


def test_an_estimate_where_nothing_fits_says_to_measure(
    http: httpx.Client, measured: dict[str, Any]
) -> None:
    tiny = {"key": "t" * 24, "kind": "cuda", "name": "tiny-gpu", "capacity_bytes": 50 * MiB}
    http.post("/api/v1/devices", json=tiny)
    error = error_of(recommendation(http, device="tiny-gpu", global_batch_size=8), 409)
    assert error["code"] == "nothing_fits"
    assert "profile the workload on this device" in error["message"]


def test_a_measured_profile_where_nothing_fits_is_409(http: httpx.Client) -> None:
    upload(http, sample_profile(max_micro_batch_size=0))
    error = error_of(recommendation(http, global_batch_size=8), 409)
    assert "not even a micro batch of 1" in error["message"]


def _report(http: httpx.Client, micro_batch_size: int, **changes: Any) -> httpx.Response:
    body = {
        "workload": "gpt-test",
        "device": "cpu-test",
        "micro_batch_size": micro_batch_size,
        "message": "CUDA out of memory. Tried to allocate 2.00 GiB",
        **changes,
    }
    return http.post("/api/v1/oom-reports", json=body)


def test_an_oom_report_lowers_recommendations_until_a_newer_profile(
    http: httpx.Client, measured: dict[str, Any]
) -> None:
    report = _report(http, 10)
    assert report.status_code == 201, report.text
    assert report.json()["micro_batch_size"] == 10
    assert _report(http, 11).status_code == 201  # a larger OOM changes nothing

    for policy in ("balanced", "max", "even", "throughput"):
        answer = _ok(recommendation(http, global_batch_size=36, policy=policy))
        assert answer["micro_batch_size"] <= 9
        assert answer["oom_limit"] == 10
    assert _ok(recommendation(http, global_batch_size=36))["split"] == [[9, 4]]

    newer = sample_profile(
        max_micro_batch_size=12, created_at=datetime.now(UTC) + timedelta(seconds=1)
    )
    upload(http, newer)
    lifted = _ok(recommendation(http, global_batch_size=36))
    assert lifted["micro_batch_size"] == 12
    assert lifted["oom_limit"] is None


def test_an_oom_at_one_leaves_nothing_and_says_how_to_lift_it(
    http: httpx.Client, measured: dict[str, Any]
) -> None:
    _report(http, 1)
    error = error_of(recommendation(http, global_batch_size=8), 409)
    assert "profile the workload on this device again" in error["message"]


def test_an_oom_report_also_lowers_an_estimate(
    http: httpx.Client, measured: dict[str, Any]
) -> None:
    big = {"key": "g" * 24, "kind": "cuda", "name": "big-gpu", "capacity_bytes": 800 * MiB}
    http.post("/api/v1/devices", json=big)
    assert _report(http, 40, device="big-gpu").status_code == 201
    answer = _ok(recommendation(http, device="big-gpu", global_batch_size=128))
    assert (answer["basis"], answer["max_micro_batch_size"], answer["oom_limit"]) == (
        "estimated",
        39,
        40,
    )
    assert answer["split"] == [[32, 4]]  # 128 in the fewest micro batches below 40


def test_bad_oom_reports_are_refused(http: httpx.Client, measured: dict[str, Any]) -> None:
    assert "no workload" in error_of(_report(http, 4, workload="nope"), 404)["message"]
    assert "no device" in error_of(_report(http, 4, device="nope"), 404)["message"]
    error = error_of(_report(http, 0), 422)
    assert error["fields"][0]["location"] == ["body", "micro_batch_size"]
    error_of(_report(http, 4, extra="x"), 422)


BAD_QUERIES: list[tuple[dict[str, Any], str, str]] = [
    ({"global_batch_size": 40, "world_size": 3}, "world_size", "not divisible by world size 3"),
    (
        {"global_batch_size": 40, "policy": "fastest"},
        "policy",
        "'balanced', 'max', 'even' or 'throughput'",
    ),
    ({"global_batch_size": 0}, "global_batch_size", "greater than or equal to 1"),
    ({"global_batch_size": -8}, "global_batch_size", "greater than or equal to 1"),
    ({"global_batch_size": 2**40}, "global_batch_size", "less than or equal to"),
    ({"global_batch_size": 8, "world_size": 0}, "world_size", "greater than or equal to 1"),
    ({"global_batch_size": "lots"}, "global_batch_size", "an integer in plain decimal digits"),
    ({}, "global_batch_size", "Field required"),
    ({"global_batch_size": 8, "workload": ""}, "workload", "at least 1 character"),
    ({"global_batch_size": 8, "colour": "red"}, "colour", "Extra inputs are not permitted"),
]


def test_bad_queries_are_field_level_422_saying_what_is_allowed(
    http: httpx.Client, measured: dict[str, Any]
) -> None:
    for params, field, message in BAD_QUERIES:
        error = error_of(recommendation(http, **params), 422)
        matching = [f for f in error["fields"] if f["location"] == ["query", field]]
        assert matching, (params, error)
        assert message in matching[0]["message"], (params, error)


def test_unknown_workload_or_device_is_404_saying_what_to_do(
    http: httpx.Client, measured: dict[str, Any]
) -> None:
    error = error_of(recommendation(http, workload="llama-7b", global_batch_size=8), 404)
    assert "no workload has the key or name 'llama-7b'" in error["message"]
    assert "tuner profile" in error["message"]
    error = error_of(recommendation(http, device="tpu-v9", global_batch_size=8), 404)
    assert "no device has the key or name 'tpu-v9'" in error["message"]
    assert "worker registers" in error["message"]


def test_a_workload_never_profiled_anywhere_is_404(http: httpx.Client) -> None:
    upload(http, sample_profile())
    workload = {
        "key": "v" * 24,
        "name": "vit",
        "precision": "bf16",
        "activation_checkpointing": False,
        "parameter_count": 1,
        "optimizer": "AdamW",
    }
    http.post("/api/v1/workloads", json=workload)
    error = error_of(recommendation(http, workload="vit", global_batch_size=8), 404)
    assert "none on another device to estimate from" in error["message"]


def test_a_name_shared_by_one_owners_devices_answers_the_newest(http: httpx.Client) -> None:
    for key, limit in (("k1" * 12, 200), ("k2" * 12, 300)):
        upload(
            http,
            sample_profile(device_key=key, device_name="x86_64", capacity_bytes=limit * MiB),
        )
    answer = _ok(recommendation(http, device="x86_64", global_batch_size=8))
    assert (answer["device_key"], answer["capacity_bytes"]) == ("k2" * 12, 300 * MiB)
    older = _ok(recommendation(http, device="k1" * 12, global_batch_size=8))
    assert older["capacity_bytes"] == 200 * MiB


def test_openapi_documents_the_questions_parameters(http: httpx.Client) -> None:
    """The route reads its query itself (for speed); the schema must still say what it takes."""
    operation = http.get("/openapi.json").json()["paths"]["/api/v1/recommendation"]["get"]
    parameters = {p["name"]: p for p in operation["parameters"]}
    assert set(parameters) == {
        "workload",
        "device",
        "global_batch_size",
        "world_size",
        "parallel",
        "policy",
        "seq_len",
        "tokens_per_micro_batch",
        "tp",
        "project",
        "split",
    }
    assert all(p["in"] == "query" for p in parameters.values())
    assert [name for name, p in parameters.items() if p["required"]] == [
        "workload",
        "device",
        "global_batch_size",
    ]
    assert parameters["policy"]["schema"]["enum"] == ["balanced", "max", "even", "throughput"]
    assert parameters["policy"]["schema"]["default"] == "balanced"
    assert parameters["global_batch_size"]["schema"]["minimum"] == 1
    assert parameters["split"]["schema"]["enum"] == ["runs", "flat"]
    assert set(operation["responses"]) == {"200", "422"}


def test_an_answer_at_m_star_1_and_the_largest_batch_is_small(http: httpx.Client) -> None:
    """The split travels as runs: at M* = 1 and a global batch of 2**20, listing every
    micro batch made one answer 2,098,249 bytes."""
    upload(http, sample_profile(max_micro_batch_size=1))
    response = recommendation(http, global_batch_size=MAX_GLOBAL_BATCH_SIZE)
    assert len(response.content) < 2048, len(response.content)
    answer = _ok(response)
    assert answer["split"] == [[1, MAX_GLOBAL_BATCH_SIZE]]
    assert answer["grad_accum"] == MAX_GLOBAL_BATCH_SIZE
    small = _ok(recommendation(http, global_batch_size=256))
    assert len(response.content) - len(json.dumps(small).encode()) < 100


def test_the_flat_split_only_on_request_and_bounded(
    http: httpx.Client, measured: dict[str, Any]
) -> None:
    runs = _ok(recommendation(http, global_batch_size=80, world_size=2, policy="max"))
    flat = _ok(recommendation(http, global_batch_size=80, world_size=2, policy="max", split="flat"))
    assert flat["split"] == [12, 12, 12, 4]
    assert {**flat, "split": runs["split"], "profile_age_s": 0} == {**runs, "profile_age_s": 0}
    # M* is 12: 4,096 micro batches of 12 are listed, one more is refused with a way out.
    most = recommendation(http, global_batch_size=12 * MAX_FLAT_SPLIT, split="flat")
    assert len(_ok(most)["split"]) == MAX_FLAT_SPLIT
    error = error_of(
        recommendation(http, global_batch_size=12 * MAX_FLAT_SPLIT + 1, split="flat"), 422
    )
    assert error["message"] == (
        f"split=flat lists at most {MAX_FLAT_SPLIT} micro batches and this step has "
        f"{MAX_FLAT_SPLIT + 1}: use the runs (split=runs, the default), [[size, count], ...]"
    )
    error = error_of(recommendation(http, global_batch_size=80, split="all"), 422)
    assert error["fields"][0]["location"] == ["query", "split"]
