"""Whose clock counts: profiles carry the measuring machine's time, which can be off by
an hour either way; which profile is newest, and whether an OOM report came after a
profile, are decided by the time the service received each (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.api.builders import recommendation, upload
from tests.api.documents import sample_profile
from tuner.core.parallel import Parallel

# The store is the subject: SQLite and PostgreSQL.
pytestmark = pytest.mark.both_stores

HOUR = timedelta(hours=1)
DDP = Parallel(mode="ddp")


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
    # Both clocks are shown: the list's order is the service's, whatever the machines said.
    assert listed[0]["received_at"] > listed[1]["received_at"]
    assert listed[0]["created_at"] < listed[1]["created_at"]


def test_an_estimate_across_world_sizes_names_the_profile_received_last(
    http: httpx.Client,
) -> None:
    def ddp(world_size: int, clock: timedelta) -> dict[str, Any]:
        profile = sample_profile(
            max_micro_batch_size=8, workload_key="p" * 24, created_at=datetime.now(UTC) + clock
        )
        return upload(http, profile.model_copy(update={"world_size": world_size, "parallel": DDP}))

    ddp(4, clock=+HOUR)
    last = ddp(2, clock=-HOUR)
    response = recommendation(
        http, workload="p" * 24, global_batch_size=36, world_size=3, parallel="ddp"
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["basis"] == "estimated"
    assert answer["profile_id"] == last["id"]
