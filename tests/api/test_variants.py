"""Explored variants in the store and the service: profiles linked by ``variant_group``
round-trip, ``GET /api/v1/profiles/{id}/variants`` compares them, and revision 0005 adds
and removes the link without touching the profiles (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from api import migrate
from api.db import create_db_engine
from tests.api.documents import sample_profile
from tests.api.migration_rows import as_json, profile_with_a_probe, query, rows_before_0004
from tests.helpers import REPO_ROOT, subprocess_env, tuner_executable
from tests.services import ServerThread
from tuner.core.results import Profile
from tuner.core.speeds import SpeedCurve, TimedSize

GROUP = "a1b2c3d4e5f6a1b2c3d4e5f6"
WHEN = datetime(2026, 11, 20, tzinfo=UTC)


def variant_curve(per_sample: float, spread: float, *, per_rank: int = 32) -> SpeedCurve:
    """A speed curve as ``tuner profile --explore`` times each variant for ``per_rank``
    samples a rank: micro batches of 1 to 9, two rounds ``spread`` apart."""
    slowest = per_sample / (1 - spread)
    return SpeedCurve(
        sizes=[
            TimedSize(micro_batch_size=m, seconds_per_sample=[per_sample, slowest])
            for m in (1, 2, 4, 8, 9)
        ],
        optimizer_seconds=0.01,
        per_rank_batch_size=per_rank,
    )


# The variants' curves: bf16 (index 2) trains the batch fastest, although checkpointing
# (index 1) is the fastest at its M*.
VARIANT_CURVES = [
    variant_curve(0.010, 0.02),
    variant_curve(0.008, 0.05),
    variant_curve(0.004, 0.03),
]


def explored(chosen: int | None = None, *, timed: bool = False) -> list[Profile]:
    """Three variants of one exploration, each its own workload, as the CLI uploads them;
    the one at index ``chosen`` marked as the exploration's choice; with ``timed``, each
    with its speed curve (``VARIANT_CURVES``)."""
    options = [
        ({"checkpointing": False, "precision": "fp32"}, 4),
        ({"checkpointing": True, "precision": "fp32"}, 9),
        ({"checkpointing": False, "precision": "bf16"}, 6),
    ]
    return [
        sample_profile(
            max_micro_batch_size=found,
            workload_key=f"w{index}".ljust(24, "x"),
            created_at=WHEN + timedelta(seconds=index),
        ).model_copy(
            update={
                "variant": variant,
                "variant_group": GROUP,
                "variant_chosen": index == chosen,
                "speeds": VARIANT_CURVES[index] if timed else None,
            }
        )
        for index, (variant, found) in enumerate(options)
    ]


def upload(http: httpx.Client, profile: Profile) -> httpx.Response:
    return http.post("/api/v1/profiles", json=profile.model_dump(mode="json"))


def test_variants_are_stored_linked_and_compared(http: httpx.Client) -> None:
    profiles = explored()
    ids = []
    for profile in profiles:
        created = upload(http, profile)
        assert created.status_code == 201, created.text
        ids.append(created.json()["id"])
    alone = upload(http, sample_profile(created_at=WHEN)).json()["id"]
    # Sent again (a retry), a variant is recognised as stored, link and all.
    assert upload(http, profiles[1]).status_code == 200

    stored = http.get(f"/api/v1/profiles/{ids[1]}").json()
    assert stored["variant"] == {"checkpointing": True, "precision": "fp32"}
    assert stored["variant_group"] == GROUP

    answer: dict[str, Any] = http.get(f"/api/v1/profiles/{ids[2]}/variants").json()
    assert answer["variant_group"] == GROUP
    assert answer["count"] == 3
    rows = answer["data"]
    assert [row["profile_id"] for row in rows] == ids
    assert [row["variant"] for row in rows] == [p.variant for p in profiles]
    assert [row["max_micro_batch_size"] for row in rows] == [4, 9, 6]
    for row, profile in zip(rows, profiles, strict=True):
        at_max = profile.probe_at(profile.max_micro_batch_size)
        assert at_max is not None
        assert row["peak_bytes"] == at_max.peak_bytes
        assert row["samples_per_second"] == at_max.samples_per_second

    single = http.get(f"/api/v1/profiles/{alone}/variants").json()
    assert (single["variant_group"], single["count"]) == (None, 1)
    assert single["data"][0]["variant"] == {}
    missing = http.get("/api/v1/profiles/999999/variants")
    assert missing.status_code == 404


def test_an_exploration_keeps_the_one_variant_it_chose(http: httpx.Client) -> None:
    profiles = explored(chosen=2)
    ids = [upload(http, profile).json()["id"] for profile in profiles]
    assert upload(http, profiles[2]).status_code == 200  # a retry of the chosen one
    rows = http.get(f"/api/v1/profiles/{ids[0]}/variants").json()["data"]
    assert [row["chosen"] for row in rows] == [False, False, True]
    assert http.get(f"/api/v1/profiles/{ids[2]}").json()["variant_chosen"] is True

    # A second choice in the same exploration is refused, and nothing is stored.
    another = profiles[1].model_copy(
        update={"variant_chosen": True, "created_at": WHEN + timedelta(minutes=5)}
    )
    refused = upload(http, another)
    assert refused.status_code == 409, refused.text
    assert f"profile {ids[2]} is the chosen variant" in refused.json()["error"]["message"]
    assert http.get(f"/api/v1/profiles/{ids[0]}/variants").json()["count"] == 3
    # Chosen among no exploration: refused in one line.
    alone = sample_profile(created_at=WHEN + timedelta(minutes=6)).model_dump(mode="json")
    refused = http.post("/api/v1/profiles", json={**alone, "variant_chosen": True})
    assert refused.status_code == 422
    assert "variant_chosen is true but the profile has no variant_group" in refused.text


def test_an_unstorable_variant_is_refused_in_one_line(http: httpx.Client) -> None:
    bad = sample_profile(created_at=WHEN).model_dump(mode="json")
    bad["variant_group"] = "not a key!"
    refused = http.post("/api/v1/profiles", json=bad)
    assert refused.status_code == 422
    assert "variant_group" in refused.text


def add_a_variant_row(database_url: str) -> None:
    """Profile 2, a bf16 variant of exploration ``GROUP``, with its probe, as SQL rows."""
    engine = create_db_engine(database_url)
    with engine.begin() as connection:
        profile_with_a_probe(
            connection,
            2,
            created_at=datetime(2026, 11, 2, tzinfo=UTC),
            max_micro_batch_size=6,
            profile={"variant": '{"precision": "bf16"}', "variant_group": GROUP},
        )
    engine.dispose()


@pytest.mark.both_stores  # a revision's rows: the store is the subject
def test_revision_0005_adds_the_link_and_going_back_keeps_the_profiles(
    database_url: str,
) -> None:
    migrate.upgrade(database_url, "0003")
    rows_before_0004(database_url)
    migrate.upgrade(database_url, "0005")
    [(variant, group)] = query(database_url, "SELECT variant, variant_group FROM profiles")
    assert as_json(variant) == {}
    assert group is None

    add_a_variant_row(database_url)
    found = query(database_url, f"SELECT id FROM profiles WHERE variant_group = '{GROUP}'")
    assert found == [(2,)]

    migrate.downgrade(database_url, "0004")
    assert migrate.current_revision(database_url) == "0004"
    assert query(database_url, "SELECT id FROM profiles ORDER BY id") == [(1,), (2,)]
    migrate.upgrade(database_url)
    assert query(database_url, "SELECT id, variant_group FROM profiles ORDER BY id") == [
        (1, None),
        (2, None),
    ]


@pytest.mark.slow
def test_profile_explore_upload_stores_every_variant_linked(
    http: httpx.Client, service: ServerThread, admin_token: str
) -> None:
    env = {**subprocess_env(), "TUNER_URL": service.url, "TUNER_TOKEN": admin_token}
    done = subprocess.run(
        [str(tuner_executable()), "profile", "tests.variant_workloads:stack", "--device", "cpu",
         "--memory-limit", "1000000", "--global-batch-size", "16", "--explore", "--json",
         "--upload"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    answer = http.get(f"/api/v1/profiles/{printed['profile_id']}/variants").json()
    assert answer["count"] == 4
    assert answer["variant_group"] == printed["variant_group"]
    assert [row["variant"] for row in answer["data"]] == [v["variant"] for v in printed["variants"]]
    assert [row["max_micro_batch_size"] for row in answer["data"]] == [
        v["max_micro_batch_size"] for v in printed["variants"]
    ]
    # The choice is stored: the variant the CLI chose (by its plan's timed speed), on the
    # profile it printed and uploaded, and on no other.
    assert printed["variant_chosen"] is True
    assert [row["chosen"] for row in answer["data"]] == [v["chosen"] for v in printed["variants"]]
    [chosen] = [row for row in answer["data"] if row["chosen"]]
    assert chosen["profile_id"] == printed["profile_id"]
    stored = http.get(f"/api/v1/profiles/{printed['profile_id']}").json()
    assert stored["variant_chosen"] is True
