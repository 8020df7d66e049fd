"""Names over real HTTP on SQLite and PostgreSQL (:mod:`tuner.answer.identity`): no token's later
write changes what a name answers for anyone, and a name keeps answering as its owner
profiles more (other modes, an exploration's variants, a changed model, another device of
the same name)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from api.db import Database
from tests.api.builders import at, error_of, profile_with_speeds, recommendation, upload
from tests.api.conftest import make_token
from tests.api.documents import MiB, sample_profile
from tests.services import ServerThread
from tuner.core.parallel import Parallel
from tuner.core.results import Profile

# The store is the subject: SQLite and PostgreSQL.
pytestmark = pytest.mark.both_stores

ALICE_WORKLOAD, MALLORY_WORKLOAD = "a" * 24, "m" * 24
ALICE_DEVICE, MALLORY_DEVICE = "e" * 24, "f" * 24


def _client(service: ServerThread, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=service.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


@pytest.fixture
def alice(service: ServerThread, database: Database) -> Iterator[httpx.Client]:
    with _client(service, make_token(database, "write", name="alice")) as client:
        yield client


@pytest.fixture
def mallory(service: ServerThread, database: Database) -> Iterator[httpx.Client]:
    """Another token: ``write`` and ``worker``, the scopes that may create names."""
    with _client(service, make_token(database, "write", "worker", name="mallory")) as client:
        yield client


def _ok(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _alices(**changes: Any) -> Profile:
    return sample_profile(
        workload_key=ALICE_WORKLOAD, device_key=ALICE_DEVICE, max_micro_batch_size=8, **changes
    )


def test_another_tokens_rows_cannot_shadow_a_name(
    http: httpx.Client, alice: httpx.Client, mallory: httpx.Client
) -> None:
    """Mallory registers a workload and a device under Alice's names, newer, in every way
    a token can: a profile, POST /workloads, POST /devices, a worker's registration, and
    a DDP workload. The names still answer Alice's, for every reader; Mallory's rows
    stay reachable by their keys."""
    stored = upload(alice, _alices(created_at=at(0)))
    before = _ok(recommendation(http, global_batch_size=16))
    assert (before["workload_key"], before["device_key"]) == (ALICE_WORKLOAD, ALICE_DEVICE)

    upload(
        mallory,
        sample_profile(
            workload_key=MALLORY_WORKLOAD,
            device_key=MALLORY_DEVICE,
            max_micro_batch_size=1,
            capacity_bytes=400 * MiB,
            created_at=at(10),
        ),
    )
    workload = {
        "key": "n" * 24,
        "name": "gpt-test",
        "precision": "fp32",
        "activation_checkpointing": False,
        "parameter_count": 1_000_000,
        "optimizer": "AdamW",
    }
    assert mallory.post("/api/v1/workloads", json=workload).status_code == 201
    device = {"key": "g" * 24, "kind": "cpu", "name": "cpu-test", "capacity_bytes": MiB}
    assert mallory.post("/api/v1/devices", json=device).status_code == 201
    worker = {
        "name": "shadow",
        "device_key": "h" * 24,
        "device": {"kind": "cpu", "name": "cpu-test", "capacity_bytes": MiB},
    }
    assert mallory.post("/api/v1/workers", json=worker).status_code == 201
    ddp = sample_profile(
        workload_key="p" * 24, device_key=ALICE_DEVICE, max_micro_batch_size=1, created_at=at(20)
    ).model_copy(update={"world_size": 2, "parallel": Parallel(mode="ddp")})
    upload(mallory, ddp)

    for reader in (http, alice, mallory):
        after = _ok(recommendation(reader, global_batch_size=16))
        assert after == {**before, "profile_age_s": after["profile_age_s"]}
    # Asked for DDP, Alice's name has no DDP workload of hers: her one-process one answers,
    # with the caveat, never Mallory's DDP profile.
    under_ddp = _ok(recommendation(alice, global_batch_size=16, world_size=2, parallel="ddp"))
    assert (under_ddp["profile_id"], under_ddp["one_process_only"]) == (stored["id"], True)
    # Lists filtered by the name show Alice's profiles only; keys reach Mallory's.
    listed = _ok(http.get("/api/v1/profiles", params={"workload": "gpt-test"}))
    assert [row["id"] for row in listed["data"]] == [stored["id"]]
    theirs = _ok(
        recommendation(http, workload=MALLORY_WORKLOAD, device=MALLORY_DEVICE, global_batch_size=1)
    )
    assert theirs["max_micro_batch_size"] == 1
    # An OOM report by name lands on Alice's pair.
    report = {"workload": "gpt-test", "device": "cpu-test", "micro_batch_size": 8}
    reported = alice.post("/api/v1/oom-reports", json=report)
    assert reported.status_code == 201, reported.text
    assert (reported.json()["workload_key"], reported.json()["device_key"]) == (
        ALICE_WORKLOAD,
        ALICE_DEVICE,
    )


@pytest.mark.slow
def test_a_name_first_registered_by_another_token_is_not_taken_over(
    alice: httpx.Client, mallory: httpx.Client
) -> None:
    """First come: Mallory's name stays Mallory's even when Alice, later, uploads more."""
    upload(mallory, sample_profile(max_micro_batch_size=3, created_at=at(0)))
    upload(alice, _alices(created_at=at(5)))
    assert _ok(recommendation(alice, global_batch_size=6))["max_micro_batch_size"] == 3


def test_a_name_keeps_answering_as_its_owner_profiles_more(http: httpx.Client) -> None:
    """One token: an exploration's three variants (the fastest at its own M* answers),
    then a DDP variant (picked by mode), then a changed model (the newest answers), then
    a second device of the same name (the newest registered answers)."""
    speeds = {"slow": 50.0, "fast": 120.0, "middle": 90.0}
    variants = {}
    for index, (label, speed) in enumerate(speeds.items()):
        profile = profile_with_speeds(
            {1: 10.0, 4: speed}, max_micro_batch_size=4, workload_key=label[0] * 24,
            created_at=at(index),
        ).model_copy(update={"variant": {"label": label}, "variant_group": "x" * 24})  # fmt: skip
        variants[label] = upload(http, profile)["id"]
    assert _ok(recommendation(http, global_batch_size=8))["profile_id"] == variants["fast"]

    ddp = sample_profile(workload_key="p" * 24, max_micro_batch_size=6, created_at=at(4))
    ddp_id = upload(
        http, ddp.model_copy(update={"world_size": 2, "parallel": Parallel(mode="ddp")})
    )["id"]
    asked = _ok(recommendation(http, global_batch_size=12, world_size=2, parallel="ddp"))
    assert asked["profile_id"] == ddp_id
    assert _ok(recommendation(http, global_batch_size=8))["profile_id"] == variants["fast"]

    changed = upload(http, sample_profile(workload_key="c" * 24, created_at=at(5)))["id"]
    assert _ok(recommendation(http, global_batch_size=8))["profile_id"] == changed

    upload(http, sample_profile(workload_key="c" * 24, device_key="z" * 24, created_at=at(6)))
    answer = _ok(recommendation(http, global_batch_size=8))
    assert answer["device_key"] == "z" * 24


def test_a_name_answers_the_variant_its_exploration_chose_not_the_fastest(
    http: httpx.Client,
) -> None:
    """With a global batch the CLI chooses by the plan's speed, which need not be the
    fastest at M*: the stored choice answers the name."""
    speeds = {"slow": 50.0, "fast": 120.0, "chosen": 90.0}
    variants = {}
    for index, (label, speed) in enumerate(speeds.items()):
        profile = profile_with_speeds(
            {1: 10.0, 4: speed}, max_micro_batch_size=4, workload_key=label[0] * 24,
            created_at=at(index),
        ).model_copy(update={"variant": {"label": label}, "variant_group": "x" * 24,
                             "variant_chosen": label == "chosen"})  # fmt: skip
        variants[label] = upload(http, profile)["id"]
    assert _ok(recommendation(http, global_batch_size=8))["profile_id"] == variants["chosen"]


def test_an_unknown_name_says_where_names_come_from(http: httpx.Client) -> None:
    error = error_of(recommendation(http, workload="nobody", global_batch_size=1), 404)
    assert "tuner profile TARGET --upload" in error["message"]


def test_a_jobs_results_join_the_name_of_whoever_queued_it(
    service: ServerThread, database: Database, alice: httpx.Client
) -> None:
    """Alice profiles in one process, then queues a DDP job that a worker (its own
    ``worker`` token) measures: the DDP workload is Alice's, so her name answers it."""
    from tests.api.jobs_helpers import api_client, claim, queue, register

    upload(alice, _alices(created_at=at(0)))
    ddp = _alices(created_at=at(5)).model_copy(
        update={"workload_key": "p" * 24, "world_size": 2, "parallel": Parallel(mode="ddp")}
    )
    with (
        api_client(service, make_token(database, "worker", name="gpu-host")) as worker,
        httpx.Client(base_url=f"{service.url}/api/v1", headers=alice.headers) as requester,
    ):
        job = queue(requester, device="cpu-test")
        claimed = claim(worker, register(worker, device_key=ALICE_DEVICE))
        assert claimed is not None
        assert claimed["job"]["id"] == job["id"]
        lease = claimed["lease"]["lease_id"]
        body = {"lease_id": lease, "profile": ddp.model_dump(mode="json")}
        done = worker.post(f"/jobs/{job['id']}/result", json=body)
        assert done.status_code == 200, done.text
    answer = _ok(recommendation(alice, global_batch_size=12, world_size=2, parallel="ddp"))
    assert (answer["workload_key"], answer["basis"]) == ("p" * 24, "measured")


def test_another_tokens_workload_cannot_join_a_length_family(
    http: httpx.Client, alice: httpx.Client, mallory: httpx.Client
) -> None:
    """A family of lengths is its first member's registrant's: Mallory's member of Alice's
    family at the same length is never the one a question by length reads."""
    family = "q" * 24

    def member(key: str, found: int, minutes: float) -> Profile:
        profile = sample_profile(
            workload_key=key, max_micro_batch_size=found, created_at=at(minutes)
        )
        workload = profile.workload.model_copy(update={"seq_len": 16, "length_family": family})
        return profile.model_copy(update={"workload": workload})

    upload(alice, member(ALICE_WORKLOAD, 8, 0))
    upload(mallory, member(MALLORY_WORKLOAD, 1, 5))
    for reference in (family, "gpt-test"):
        answer = _ok(recommendation(http, workload=reference, seq_len=16, global_batch_size=8))
        assert (answer["workload_key"], answer["max_micro_batch_size"]) == (ALICE_WORKLOAD, 8)
