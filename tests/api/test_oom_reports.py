"""OOM reports over real HTTP on SQLite and PostgreSQL: the size a run settled on is
what the next answer gives, and one event is one report however often it is sent."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.builders import at, error_of, profile_with_speeds, recommendation, upload
from tests.api.documents import MiB

SPEEDS = {1: 10.0, 4: 60.0, 8: 110.0, 10: 96.0, 12: 100.0}


@pytest.fixture
def measured(http: httpx.Client) -> dict[str, Any]:
    profile = profile_with_speeds(
        SPEEDS, max_micro_batch_size=12, capacity_bytes=400 * MiB, created_at=at(0)
    )
    return upload(http, profile)


def _report(http: httpx.Client, size: int, **fields: Any) -> httpx.Response:
    body = {"workload": "gpt-test", "device": "cpu-test", "micro_batch_size": size, **fields}
    return http.post("/api/v1/oom-reports", json=body)


def _answer(http: httpx.Client) -> dict[str, Any]:
    response = recommendation(http, global_batch_size=36, policy="max")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_the_size_a_run_settled_on_is_the_next_answer(
    http: httpx.Client, measured: dict[str, Any]
) -> None:
    assert _answer(http)["micro_batch_size"] == 12
    report = _report(http, 12, settled_micro_batch_size=6)
    assert report.status_code == 201, report.text
    assert report.json()["settled_micro_batch_size"] == 6
    # Not 11: no run has shown anything between 6 and 12 to fit.
    answer = _answer(http)
    assert (answer["micro_batch_size"], answer["oom_limit"]) == (6, 7)
    # A report without a settled size still bounds below its failed size.
    assert _report(http, 5).status_code == 201
    assert _answer(http)["micro_batch_size"] == 4


def test_one_event_is_one_report_however_often_it_is_sent(
    http: httpx.Client, measured: dict[str, Any]
) -> None:
    first = _report(http, 10, settled_micro_batch_size=5, idempotency_key="event-0001")
    again = _report(http, 10, settled_micro_batch_size=5, idempotency_key="event-0001")
    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    other = _report(http, 10, settled_micro_batch_size=5, idempotency_key="event-0002")
    assert other.json()["id"] != first.json()["id"]
    reused = error_of(_report(http, 8, idempotency_key="event-0001"), 409)
    assert "belongs to another report" in reused["message"]


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"settled_micro_batch_size": 10}, "must be below the failed"),
        ({"idempotency_key": "short"}, "idempotency_key"),
        ({"idempotency_key": "has spaces in it"}, "idempotency_key"),
    ],
)
def test_bad_reports_are_refused_and_change_nothing(
    http: httpx.Client, measured: dict[str, Any], fields: dict[str, Any], where: str
) -> None:
    refused = _report(http, 10, **fields)
    assert refused.status_code == 422
    assert where in refused.text
    assert _answer(http)["oom_limit"] is None
