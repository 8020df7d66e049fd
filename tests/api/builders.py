"""Profiles shaped for one test: chosen throughputs, times, keys; and HTTP helpers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from tests.api.documents import sample_probe, sample_profile
from tuner.core.results import Profile

BASE_TIME = datetime(2026, 11, 1, tzinfo=UTC)


def at(minutes: float) -> datetime:
    """A fixed point in time, ``minutes`` after the tests' base time."""
    return BASE_TIME + timedelta(minutes=minutes)


def profile_with_speeds(
    speeds: dict[int, float], *, max_micro_batch_size: int, **kwargs: Any
) -> Profile:
    """A profile whose fitting probes ran at ``speeds`` (samples per second by size), plus
    a probe one above ``max_micro_batch_size`` that did not fit."""
    base = sample_profile(max_micro_batch_size=max_micro_batch_size, **kwargs)
    probes = [
        sample_probe(m, fits=True).model_copy(update={"samples_per_second": speed})
        for m, speed in sorted(speeds.items())
    ]
    probes.append(sample_probe(max_micro_batch_size + 1, fits=False))
    return base.model_copy(update={"probes": probes})


def upload(http: httpx.Client, profile: Profile) -> dict[str, Any]:
    response = http.post("/api/v1/profiles", json=profile.model_dump(mode="json"))
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def recommendation(http: httpx.Client, **params: Any) -> httpx.Response:
    defaults = {"workload": "gpt-test", "device": "cpu-test"}
    return http.get("/api/v1/recommendation", params={**defaults, **params})


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    """The error body of ``response``, which must have ``status``."""
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    return error
