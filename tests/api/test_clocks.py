"""Whose clock counts: profiles carry the measuring machine's time, which can be off by
an hour either way; which profile is newest, and whether an OOM report came after a
profile, are decided by the time the service received each (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from tests.api.builders import recommendation, upload
from tests.api.documents import sample_profile

HOUR = timedelta(hours=1)


def _profile(http: httpx.Client, m_star: int, clock: timedelta) -> dict[str, Any]:
    """A profile measured just now by a machine whose clock is off by ``clock``."""
    return upload(
        http, sample_profile(max_micro_batch_size=m_star, created_at=datetime.now(UTC) + clock)
    )


def _oom(http: httpx.Client, size: int) -> None:
    body = {"workload": "gpt-test", "device": "cpu-test", "micro_batch_size": size}
    assert http.post("/api/v1/oom-reports", json=body).status_code == 201


def _answer(http: httpx.Client) -> dict[str, Any]:
    response = recommendation(http, global_batch_size=36, policy="max")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_an_oom_after_a_profile_from_a_fast_clock_still_counts(http: httpx.Client) -> None:
    _profile(http, 12, clock=+HOUR)
    _oom(http, 10)
    answer = _answer(http)
    assert (answer["micro_batch_size"], answer["oom_limit"]) == (9, 10)


def test_a_profile_from_a_slow_clock_after_an_oom_lifts_it(http: httpx.Client) -> None:
    _profile(http, 12, clock=timedelta(0))
    _oom(http, 10)
    assert _answer(http)["micro_batch_size"] == 9
    newer = _profile(http, 12, clock=-HOUR)
    answer = _answer(http)
    assert (answer["micro_batch_size"], answer["oom_limit"]) == (12, None)
    assert answer["profile_id"] == newer["id"]


def test_the_profile_received_last_answers_whatever_its_clock_says(http: httpx.Client) -> None:
    _profile(http, 12, clock=+HOUR)
    last = _profile(http, 8, clock=-HOUR)
    answer = _answer(http)
    assert (answer["profile_id"], answer["max_micro_batch_size"]) == (last["id"], 8)
    listed = http.get("/api/v1/profiles").json()["data"]
    assert listed[0]["id"] == last["id"]  # newest first: received last
