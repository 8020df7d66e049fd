"""OOM reports over real HTTP on SQLite and PostgreSQL: the size a run settled on is
what the next answer gives, and one event is one report however often it is sent."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from api.db import Database
from tests.api.builders import at, error_of, profile_with_speeds, recommendation, upload
from tests.api.conftest import make_token
from tests.api.documents import MiB
from tests.services import ServerThread

# The store is the subject: SQLite and PostgreSQL.
pytestmark = pytest.mark.both_stores

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
    # Created once, then replayed: 201 and 200, as a profile sent twice is.
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    other = _report(http, 10, settled_micro_batch_size=5, idempotency_key="event-0002")
    assert other.json()["id"] != first.json()["id"]
    reused = error_of(_report(http, 8, idempotency_key="event-0001"), 409)
    assert "belongs to another report" in reused["message"]


def test_a_key_replayed_with_another_message_is_refused(
    http: httpx.Client, measured: dict[str, Any]
) -> None:
    first = _report(http, 10, idempotency_key="event-0003", message="CUDA out of memory")
    assert first.status_code == 201, first.text
    changed = _report(http, 10, idempotency_key="event-0003", message="something else")
    assert "belongs to another report" in error_of(changed, 409)["message"]
    dropped = _report(http, 10, idempotency_key="event-0003")  # the message left out
    assert error_of(dropped, 409)
    assert _report(http, 10, idempotency_key="event-0003", message="CUDA out of memory").json() == (
        first.json()
    )


def test_keys_belong_to_the_token_that_sent_them(
    http: httpx.Client, measured: dict[str, Any], database: Database, service: ServerThread
) -> None:
    first = _report(http, 10, idempotency_key="event-0004", message="rank 0 of team A's run")
    assert first.status_code == 201, first.text
    other_token = make_token(database, "write", name="team-b")
    with httpx.Client(
        base_url=service.url, headers={"Authorization": f"Bearer {other_token}"}, timeout=30
    ) as other:
        theirs = _report(other, 10, idempotency_key="event-0004", message="team B's own event")
        # Their own report, not team A's (whose message they must not read)...
        assert theirs.status_code == 201, theirs.text
        assert theirs.json()["id"] != first.json()["id"]
        assert theirs.json()["message"] == "team B's own event"
        # ...and replayed as theirs.
        again = _report(other, 10, idempotency_key="event-0004", message="team B's own event")
        assert (again.status_code, again.json()["id"]) == (200, theirs.json()["id"])
    mine = _report(http, 10, idempotency_key="event-0004", message="rank 0 of team A's run")
    assert (mine.status_code, mine.json()["id"]) == (200, first.json()["id"])


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
