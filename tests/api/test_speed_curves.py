"""A profile's speed curve (tuner.core.speeds) through the service, on SQLite and
PostgreSQL over real HTTP: stored and read back whole, answering other batch sizes by the
curve, refused in one line when it describes no measurement, and migration 0017 both ways."""

from __future__ import annotations

import httpx
import pytest

from api import migrate
from tests.api.builders import error_of, recommendation, upload
from tests.api.documents import sample_profile
from tests.api.migration_rows import query, rows_before_0004
from tuner.answer.local import answer_from
from tuner.core.results import Profile
from tuner.core.speeds import SpeedCurve, TimedSize

# Micro batches of 8 train 30% faster per sample than of 64, rounds within 2%.
CURVE = SpeedCurve(
    sizes=[
        TimedSize(micro_batch_size=8, seconds_per_sample=[0.0049, 0.0050]),
        TimedSize(micro_batch_size=16, seconds_per_sample=[0.0060, 0.0061]),
        TimedSize(micro_batch_size=64, seconds_per_sample=[0.0070, 0.0071]),
    ],
    optimizer_seconds=0.02,
)


def timed_profile() -> Profile:
    return sample_profile(max_micro_batch_size=64).model_copy(update={"speeds": CURVE})


def ask(http: httpx.Client, batch: int, **more: object) -> dict[str, object]:
    response = recommendation(http, global_batch_size=batch, **more)
    assert response.status_code == 200, response.text
    body: dict[str, object] = response.json()
    return body


def test_the_curve_is_stored_whole_and_answers_every_batch_as_offline(
    http: httpx.Client,
) -> None:
    profile = timed_profile()
    stored = upload(http, profile)
    read = http.get(f"/api/v1/profiles/{stored['id']}").json()
    assert SpeedCurve.model_validate(read["speeds"]) == CURVE
    for batch in (256, 200, 96, 1000):
        answer = ask(http, batch)
        offline = answer_from(profile, global_batch_size=batch)
        assert answer["split"] == [list(run) for run in offline.split]
        assert answer["reason"] == offline.reason
        assert answer["expected_speed_spread"] == offline.expected_speed_spread
    # 256 = 4 × 64 by the fewest; the curve has 32 × 8 faster by more than the spread.
    answer = ask(http, 256)
    assert answer["split"] == [[8, 32]]
    assert str(answer["reason"]).startswith("balanced, timed: 32 micro batches of 8")
    # Another policy is not moved by the curve.
    assert ask(http, 256, policy="max")["split"] == [[64, 4]]


def test_a_profile_without_a_curve_answers_as_before(http: httpx.Client) -> None:
    upload(http, sample_profile(max_micro_batch_size=64))
    answer = ask(http, 256)
    assert answer["split"] == [[64, 4]]
    assert answer["expected_speed_spread"] is None


def test_a_curve_that_describes_no_measurement_is_refused_and_nothing_stored(
    http: httpx.Client,
) -> None:
    document = timed_profile().model_dump(mode="json")
    bad_curves = [
        {**document["speeds"], "sizes": list(reversed(document["speeds"]["sizes"]))},
        {**document["speeds"], "optimizer_seconds": -1.0},
        {**document["speeds"], "sizes": [{"micro_batch_size": 8, "seconds_per_sample": []}]},
        {**document["speeds"], "sizes": [{"micro_batch_size": 8, "seconds_per_sample": ["1"]}]},
    ]
    for curve in bad_curves:
        response = http.post("/api/v1/profiles", json={**document, "speeds": curve})
        assert "speeds" in str(error_of(response, 422))
    assert http.get("/api/v1/profiles").json()["count"] == 0


@pytest.mark.both_stores  # a revision's rows: the store is the subject
def test_migration_0017_adds_an_empty_curve_and_going_back_keeps_every_profile(
    database_url: str,
) -> None:
    migrate.upgrade(database_url, "0003")
    rows_before_0004(database_url)
    migrate.upgrade(database_url, "0016")
    migrate.upgrade(database_url, "0017")
    assert query(database_url, "SELECT id, speeds FROM profiles") == [(1, None)]
    migrate.downgrade(database_url, "0016")
    assert query(database_url, "SELECT COUNT(*) FROM profiles") == [(1,)]
    assert query(database_url, "SELECT COUNT(*) FROM probes") == [(1,)]
    migrate.upgrade(database_url)
