"""Memory timelines through the service, on SQLite and PostgreSQL: uploaded with a real
profile's probe at M*, stored and read back unchanged, downloaded as a snapshot that
torch's own ``_memory_viz`` reads, and refused in one line when oversized or inconsistent,
with nothing stored."""

from __future__ import annotations

import pickle
from typing import Any

import httpx
import pytest
from torch.cuda import _memory_viz

from tests.api.builders import error_of, upload
from tests.api.documents import sample_profile
from tests.timeline_profiles import measured_profile
from tuner.core.timeline import MAX_TIMELINE_POINTS, MemoryTimeline

# The store is the subject: SQLite and PostgreSQL.
pytestmark = pytest.mark.both_stores


def answer_probe(body: dict[str, Any]) -> dict[str, Any]:
    found = body["max_micro_batch_size"]
    probe: dict[str, Any] = [p for p in body["probes"] if p["micro_batch_size"] == found][-1]
    return probe


@pytest.mark.slow
def test_a_timeline_is_stored_and_read_back_unchanged(http: httpx.Client) -> None:
    profile = measured_profile()
    created = upload(http, profile)
    at = profile.probe_at(profile.max_micro_batch_size)
    assert at is not None
    assert at.timeline is not None
    fetched = http.get(f"/api/v1/profiles/{created['id']}").json()
    stored = MemoryTimeline.model_validate(answer_probe(fetched)["timeline"])
    assert stored == at.timeline
    assert stored.peak_bytes == answer_probe(fetched)["peak_allocated_bytes"]
    # The other probes carry none, and say so.
    assert [p["timeline"] is None for p in fetched["probes"]].count(False) == 1


def test_the_download_is_a_snapshot_torchs_memory_viz_reads(http: httpx.Client) -> None:
    profile = measured_profile()
    created = upload(http, profile)
    response = http.get(f"/api/v1/profiles/{created['id']}/memory-snapshot")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    found = profile.max_micro_batch_size
    assert (
        f'filename="profile-{created["id"]}-m{found}-memory-snapshot.pickle"'
        in response.headers["content-disposition"]
    )
    data = pickle.loads(response.content)
    assert set(data) == {"segments", "device_traces"}
    assert "segments: 1" in _memory_viz.segsum(data)
    _memory_viz.trace(data)
    # The one segment is as large as the most the step held: the probe's allocated peak.
    at = profile.probe_at(found)
    assert at is not None
    assert data["segments"][0]["total_size"] == at.peak_allocated_bytes


def test_a_profile_without_a_timeline_loads_and_its_download_says_why(
    http: httpx.Client,
) -> None:
    created = upload(http, sample_profile())
    assert all(p["timeline"] is None for p in created["probes"])
    error = error_of(http.get(f"/api/v1/profiles/{created['id']}/memory-snapshot"), 404)
    assert "has no memory timeline" in error["message"]
    assert "\n" not in error["message"]


def timeline_document(**changes: Any) -> dict[str, Any]:
    document = measured_profile().model_dump(mode="json")
    probe = answer_probe(document)
    probe["timeline"] = {**probe["timeline"], **changes}
    return document


def oversized() -> dict[str, Any]:
    count = MAX_TIMELINE_POINTS + 1
    return timeline_document(
        position=list(range(count)),
        live_bytes=[1000 + i for i in range(count)],
        operator=[0] * count,
        length=count,
        peak_bytes=1000 + count - 1,
    )


@pytest.mark.parametrize(
    ("document", "field", "says"),
    [
        (oversized, "position", "at most 1024"),
        (lambda: timeline_document(peak_bytes=1), "timeline", "is not the highest point"),
        (lambda: timeline_document(operators=["x" * 65]), "operators", "at most 64"),
        (lambda: timeline_document(live_bytes="many"), "live_bytes", "valid list"),
    ],
)
def test_a_bad_timeline_is_one_line_422_and_stores_nothing(
    http: httpx.Client, document: Any, field: str, says: str
) -> None:
    error = error_of(http.post("/api/v1/profiles", json=document()), 422)
    assert error["code"] == "bad_input"
    where = [f for f in error["fields"] if "timeline" in f["location"]]
    assert where, error
    assert field in where[0]["location"] or field == "timeline"
    assert says in where[0]["message"]
    assert all("\n" not in f["message"] for f in error["fields"])
    assert http.get("/api/v1/profiles").json()["count"] == 0
