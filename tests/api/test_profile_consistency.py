"""A stored profile's answer is a probe that ran: ``M*`` fit and ``M* + 1`` did not (or is
past the cap). Anything else is refused with a 422 at ``max_micro_batch_size`` and stores
nothing."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.builders import error_of
from tests.api.documents import sample_probe, sample_profile
from tuner.core.wire.common import INT32_MAX


def _document(max_micro_batch_size: int, sizes: dict[int, bool], **update: Any) -> dict[str, Any]:
    """A sample profile claiming ``max_micro_batch_size``, with probes at ``sizes`` (size:
    fits)."""
    probes = [sample_probe(m, fits=fits) for m, fits in sorted(sizes.items())]
    profile = sample_profile().model_copy(
        update={"max_micro_batch_size": max_micro_batch_size, "probes": probes, **update}
    )
    document: dict[str, Any] = profile.model_dump(mode="json")
    return document


def _stored(http: httpx.Client) -> int:
    response = http.get("/api/v1/profiles")
    assert response.status_code == 200, response.text
    count: int = response.json()["count"]
    return count


def test_an_answer_far_past_every_probe_is_refused(http: httpx.Client) -> None:
    # As reported: probes stop at 3,449, which did not fit, and M* claims 2**31 - 1.
    document = _document(INT32_MAX, {1: True, 3448: True, 3449: False}, size_cap=INT32_MAX)
    error = error_of(http.post("/api/v1/profiles", json=document), 422)
    assert error["fields"][0]["location"] == ["body", "max_micro_batch_size"]
    assert "max_micro_batch_size 2147483647 is not a size that fit" in error["message"]
    assert _stored(http) == 0
    # The recommendation has nothing to answer from, rather than a size nothing measured.
    answer = http.get(
        "/api/v1/recommendation",
        params={"workload": "gpt-test", "device": "cpu-test", "global_batch_size": 64},
    )
    assert answer.status_code == 404, answer.text


@pytest.mark.parametrize(
    ("found", "sizes", "update", "says"),
    [
        (12, {1: True, 8: True, 16: False}, {}, "no probe ran"),
        (8, {1: True, 8: False, 9: False}, {}, "the probe there did not fit"),
        (8, {1: True, 8: True, 9: True}, {}, "size 9 must have been probed and not fit, but it"),
        (8, {1: True, 8: True, 16: False}, {}, "no probe ran there"),
        (0, {1: True, 2: False}, {}, "size 1 must have been probed and not fit"),
        (0, {2: False}, {}, "size 1 must have been probed"),
        (64, {1: True, 64: True}, {"size_cap": 32}, "above the profile's size_cap 32"),
    ],
    ids=[
        "unprobed",
        "did-not-fit",
        "next-fit",
        "next-unprobed",
        "none-but-1-fit",
        "none-no-1",
        "past-cap",
    ],
)
def test_answers_the_probes_contradict_are_refused(
    http: httpx.Client, found: int, sizes: dict[int, bool], update: dict[str, Any], says: str
) -> None:
    response = http.post("/api/v1/profiles", json=_document(found, sizes, **update))
    error = error_of(response, 422)
    assert [f["location"] for f in error["fields"]] == [["body", "max_micro_batch_size"]]
    assert says in error["message"]
    assert _stored(http) == 0


@pytest.mark.parametrize(
    ("found", "sizes", "update"),
    [
        (8, {1: True, 8: True, 9: False}, {}),
        (32, {1: True, 16: True, 32: True}, {"size_cap": 32}),  # capped by --max
        (0, {1: False}, {}),  # nothing fits
        (1, {1: True}, {"size_cap": 1}),
    ],
    ids=["boundary", "at-cap", "nothing-fits", "cap-one"],
)
def test_answers_the_probes_bear_out_are_stored(
    http: httpx.Client, found: int, sizes: dict[int, bool], update: dict[str, Any]
) -> None:
    response = http.post("/api/v1/profiles", json=_document(found, sizes, **update))
    assert response.status_code == 201, response.text
    assert response.json()["max_micro_batch_size"] == found
