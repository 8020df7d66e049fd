"""Jobs over HTTP on the real service, on SQLite and PostgreSQL: queue, claim under a lease,
heartbeat, finish exactly once; expired leases, retries, and concurrent claims."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from api import models
from api.db import Database
from api.store.profiles import to_result
from tests.api.conftest import make_token
from tests.api.documents import sample_profile
from tests.api.jobs_helpers import (
    DEVICE_KEY,
    DEVICE_NAME,
    api_client,
    claim,
    device_document,
    get_job,
    job_service,
    profile_document,
    queue,
    register,
)

# The store is the subject: SQLite and PostgreSQL.
pytestmark = pytest.mark.both_stores

Connect = Callable[..., httpx.Client]


@pytest.fixture
def connect(migrated_url: str, database: Database) -> Iterator[Connect]:
    """``connect(**settings)``: an admin client of a service started with ``settings``."""
    token = make_token(database, "admin", name="admin")
    with ExitStack() as stack:

        def start(**settings: Any) -> httpx.Client:
            server = stack.enter_context(job_service(migrated_url, **settings))
            return stack.enter_context(api_client(server, token))

        yield start


def stored_profiles(database: Database) -> int:
    with database.session() as session:
        return session.scalar(select(func.count()).select_from(models.Profile)) or 0


def when(text: str) -> datetime:
    return datetime.fromisoformat(text)


@pytest.mark.slow
def test_queue_claim_heartbeat_result(connect: Connect, database: Database) -> None:
    client = connect()
    job = queue(client, options={"precision": "bf16"}, settings={"memory_limit_bytes": "2GiB"})
    assert job["status"] == "queued"
    assert job["attempts"] == 0
    assert job["settings"]["memory_limit_bytes"] == 2 * 2**30
    worker = register(client)

    claimed = claim(client, worker)
    assert claimed is not None
    lease = claimed["lease"]
    assert claimed["job"]["id"] == job["id"]
    assert claimed["job"]["status"] == "running"
    assert claimed["job"]["attempts"] == 1
    assert claimed["job"]["worker_id"] == worker
    assert claimed["job"]["options"] == {"precision": "bf16"}
    assert claim(client, worker) is None  # the only job is taken

    time.sleep(0.05)
    beat = client.post(f"/jobs/{job['id']}/heartbeat", json={"lease_id": lease["lease_id"]})
    assert beat.status_code == 200, beat.text
    assert when(beat.json()["lease_expires_at"]) > when(lease["lease_expires_at"])

    profile = sample_profile()
    done = client.post(
        f"/jobs/{job['id']}/result",
        json={"lease_id": lease["lease_id"], "profile": profile_document(profile)},
    )
    assert done.status_code == 200, done.text
    finished = get_job(client, job["id"])
    assert finished["status"] == "succeeded"
    assert finished["lease_expires_at"] is None
    assert finished["error"] is None
    with database.session() as session:
        assert to_result(session.get_one(models.Profile, finished["profile_id"])) == profile

    again = client.post(
        f"/jobs/{job['id']}/result",
        json={"lease_id": lease["lease_id"], "profile": profile_document(profile)},
    )
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "conflict"
    assert "already succeeded" in again.json()["error"]["message"]
    failure = client.post(
        f"/jobs/{job['id']}/failure",
        json={"lease_id": lease["lease_id"], "reason": "late", "retryable": True},
    )
    assert failure.status_code == 409
    stale_beat = client.post(f"/jobs/{job['id']}/heartbeat", json={"lease_id": lease["lease_id"]})
    assert stale_beat.status_code == 409
    assert stored_profiles(database) == 1
    assert get_job(client, job["id"])["status"] == "succeeded"


def test_result_after_expiry_and_reclaim_is_refused(connect: Connect, database: Database) -> None:
    client = connect(lease_seconds=0.5)
    job = queue(client)
    first, second = register(client, "first"), register(client, "second")
    old = claim(client, first)
    assert old is not None
    time.sleep(0.7)

    expired = client.post(
        f"/jobs/{job['id']}/heartbeat", json={"lease_id": old["lease"]["lease_id"]}
    )
    assert expired.status_code == 409
    assert "expired" in expired.json()["error"]["message"]

    new = claim(client, second)
    assert new is not None
    assert new["job"]["id"] == job["id"]
    assert new["job"]["attempts"] == 2
    assert new["job"]["worker_id"] == second
    assert "attempt 1 of 3" in new["job"]["error"]
    assert new["lease"]["lease_id"] != old["lease"]["lease_id"]

    late = client.post(
        f"/jobs/{job['id']}/result",
        json={"lease_id": old["lease"]["lease_id"], "profile": profile_document()},
    )
    assert late.status_code == 409
    assert "no longer the lease" in late.json()["error"]["message"]
    assert stored_profiles(database) == 0

    done = client.post(
        f"/jobs/{job['id']}/result",
        json={"lease_id": new["lease"]["lease_id"], "profile": profile_document()},
    )
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "succeeded"
    assert done.json()["error"] is None
    assert stored_profiles(database) == 1


def test_non_retryable_failure_fails_with_the_reason(connect: Connect) -> None:
    client = connect()
    job = queue(client)
    worker = register(client)
    claimed = claim(client, worker)
    assert claimed is not None
    response = client.post(
        f"/jobs/{job['id']}/failure",
        json={
            "lease_id": claimed["lease"]["lease_id"],
            "reason": "tuner profile exited 1: ValueError in loss_fn",
            "retryable": False,
        },
    )
    assert response.status_code == 200, response.text
    failed = get_job(client, job["id"])
    assert failed["status"] == "failed"
    assert failed["attempts"] == 1
    assert "not retried" in failed["error"]
    assert "ValueError in loss_fn" in failed["error"]
    assert claim(client, worker) is None


def test_a_failure_cannot_store_an_unbounded_error(connect: Connect) -> None:
    """Every reader sees a job's error: a client of its own (not ``tuner worker``, which
    sends at most 12,000 characters) is held to the schema's bound, and nothing changes."""
    client = connect()
    job = queue(client)
    claimed = claim(client, register(client))
    assert claimed is not None
    response = client.post(
        f"/jobs/{job['id']}/failure",
        json={
            "lease_id": claimed["lease"]["lease_id"],
            "reason": "x" * 100_000,
            "retryable": False,
        },
    )
    assert response.status_code == 422, response.text
    assert "reason" in response.text
    still = get_job(client, job["id"])
    assert (still["status"], still["error"]) == ("running", None)


def test_retryable_failure_requeues_until_the_last_attempt(connect: Connect) -> None:
    client = connect(max_attempts=2)
    job = queue(client)
    worker = register(client)
    for attempt in (1, 2):
        claimed = claim(client, worker)
        assert claimed is not None
        assert claimed["job"]["attempts"] == attempt
        response = client.post(
            f"/jobs/{job['id']}/failure",
            json={
                "lease_id": claimed["lease"]["lease_id"],
                "reason": f"killed by SIGSEGV ({attempt})",
                "retryable": True,
            },
        )
        assert response.status_code == 200, response.text
        assert response.json()["status"] == ("queued" if attempt == 1 else "failed")
    failed = get_job(client, job["id"])
    assert failed["status"] == "failed"
    assert failed["max_attempts"] == 2
    assert "attempt 2 of 2, the last" in failed["error"]
    assert "SIGSEGV (2)" in failed["error"]
    assert claim(client, worker) is None


@pytest.mark.slow
def test_an_expired_lease_requeues_then_fails_after_the_last_attempt(connect: Connect) -> None:
    client = connect(lease_seconds=0.3, max_attempts=2)
    job = queue(client)
    worker = register(client)
    assert claim(client, worker) is not None
    time.sleep(0.5)
    # Reading sweeps expired leases, so a person watching sees the truth.
    requeued = get_job(client, job["id"])
    assert requeued["status"] == "queued"
    assert requeued["attempts"] == 1
    assert requeued["worker_id"] is None
    assert "expired" in requeued["error"]
    assert "queued again" in requeued["error"]

    assert claim(client, worker) is not None
    time.sleep(0.5)
    listed = client.get("/jobs").json()["data"]
    assert [j["status"] for j in listed] == ["failed"]
    assert listed[0]["attempts"] == 2
    assert "attempt 2 of 2" in listed[0]["error"]
    assert "no attempts left" in listed[0]["error"]
    assert claim(client, worker) is None


def test_claims_only_jobs_for_the_workers_device(connect: Connect) -> None:
    client = connect()
    by_key = queue(client, device=DEVICE_KEY)
    queue(client, device="another-key-000000000000")
    queue(client, device="NVIDIA H100 80GB HBM3")
    by_name = queue(client, device=DEVICE_NAME)
    worker = register(client)
    elsewhere = register(client, "h100", device_key="h" * 24, device_name="NVIDIA H100 80GB HBM3")

    got = [claim(client, worker), claim(client, worker), claim(client, worker)]
    assert [c["job"]["id"] if c else None for c in got] == [by_key["id"], by_name["id"], None]
    other = claim(client, elsewhere)
    assert other is not None
    assert other["job"]["device"] == "NVIDIA H100 80GB HBM3"
    queued = client.get("/jobs", params={"status": "queued"}).json()
    assert queued["count"] == 1
    assert queued["data"][0]["device"] == "another-key-000000000000"


@pytest.mark.slow
def test_concurrent_claims_never_give_one_job_to_two_workers(connect: Connect) -> None:
    client = connect()
    jobs = [queue(client)["id"] for _ in range(24)]
    workers = [register(client, f"w{i}") for i in range(6)]
    claims: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(len(workers) * 2)

    def claim_until_empty(worker: int) -> None:
        try:
            with httpx.Client(base_url=client.base_url, headers=client.headers, timeout=60) as own:
                start.wait()
                while (got := claim(own, worker)) is not None:
                    with lock:
                        claims.append((got["job"]["id"], worker))
        except BaseException as exc:
            errors.append(exc)

    # Two threads per worker id: even one worker's concurrent claims must not collide.
    threads = [
        threading.Thread(target=claim_until_empty, args=(worker,))
        for worker in workers
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
    taken = Counter(job for job, _ in claims)
    assert sorted(taken) == sorted(jobs)
    assert set(taken.values()) == {1}
    for job, worker in claims:
        current = get_job(client, job)
        assert current["worker_id"] == worker
        assert current["attempts"] == 1


@pytest.mark.slow
def test_list_filters_and_pages(connect: Connect) -> None:
    client = connect()
    ids = [queue(client, device=f"dev-{i % 2}")["id"] for i in range(5)]
    worker = register(client, device_name="dev-0")
    assert claim(client, worker) is not None

    page = client.get("/jobs", params={"limit": 2}).json()
    assert page["count"] == 5
    assert [j["id"] for j in page["data"]] == ids[::-1][:2]
    seen = [j["id"] for j in page["data"]]
    while page["next_page_token"]:
        page = client.get(
            "/jobs", params={"limit": 2, "next_page_token": page["next_page_token"]}
        ).json()
        seen += [j["id"] for j in page["data"]]
    assert seen == ids[::-1]

    running = client.get("/jobs", params={"status": "running"}).json()
    assert [j["id"] for j in running["data"]] == [ids[0]]
    dev1 = client.get("/jobs", params={"device": "dev-1"}).json()
    assert dev1["count"] == 2
    assert {j["device"] for j in dev1["data"]} == {"dev-1"}
    none = client.get("/jobs", params={"status": "succeeded", "device": "dev-0"}).json()
    assert none == {"data": [], "count": 0, "next_page_token": None}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"target": "not a target", "device": "x"}, "target"),
        ({"target": "m:f", "device": ""}, "device"),
        ({"target": "m:f", "device": "x", "options": {"not-a-name": 1}}, "options"),
        ({"target": "m:f", "device": "x", "settings": {"memory_limit_bytes": "lots"}}, "settings"),
        ({"target": "m:f", "device": "x", "settings": {"headroom": 1.5}}, "settings"),
        ({"target": "m:f", "device": "x", "settings": {"strategy": "guess"}}, "settings"),
        ({"target": "m:f", "device": "x", "settings": {"retries": 3}}, "settings"),
        ({"target": "m:f", "device": "x", "priority": 1}, "priority"),
    ],
)
def test_bad_jobs_are_refused_field_by_field(
    connect: Connect, body: dict[str, Any], field: str
) -> None:
    client = connect()
    response = client.post("/jobs", json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "bad_input"
    assert any(field in f["location"] for f in error["fields"])


def test_unknown_ids_bad_tokens_and_bad_leases(connect: Connect) -> None:
    client = connect()
    assert client.get("/jobs/999").status_code == 404
    assert client.get(f"/jobs/{2**40}").status_code == 422  # beyond the id column
    assert client.post("/workers/999/claim").status_code == 404
    assert client.post("/workers/999/heartbeat").status_code == 404
    assert client.get("/jobs", params={"next_page_token": "garbage"}).status_code == 422
    assert client.get("/jobs", params={"status": "lost"}).status_code == 422
    job = queue(client)
    missing = client.post("/jobs/999/heartbeat", json={"lease_id": "ab"})
    assert missing.status_code == 404
    never = client.post(f"/jobs/{job['id']}/heartbeat", json={"lease_id": "ab"})
    assert never.status_code == 409  # queued: nobody holds a lease
    assert client.post(f"/jobs/{job['id']}/heartbeat", json={"lease_id": "x!"}).status_code == 422


def test_a_profile_of_another_target_is_refused(connect: Connect, database: Database) -> None:
    client = connect()
    job = queue(client, target="examples.mlp:workload")
    worker = register(client)
    claimed = claim(client, worker)
    assert claimed is not None
    response = client.post(
        f"/jobs/{job['id']}/result",
        json={"lease_id": claimed["lease"]["lease_id"], "profile": profile_document()},
    )
    assert response.status_code == 422
    assert "examples.gpt:workload" in response.json()["error"]["message"]
    assert get_job(client, job["id"])["status"] == "running"
    assert stored_profiles(database) == 0


def test_workers_register_list_and_heartbeat(connect: Connect) -> None:
    client = connect()
    first = register(client, "gpu-1")
    second = register(client, "gpu-2")  # same device: it is shared, not duplicated
    before = client.get("/workers").json()
    assert before["count"] == 2
    assert [w["name"] for w in before["data"]] == ["gpu-1", "gpu-2"]
    assert {w["device_key"] for w in before["data"]} == {DEVICE_KEY}
    assert {w["device_name"] for w in before["data"]} == {DEVICE_NAME}
    time.sleep(0.05)
    beat = client.post(f"/workers/{first}/heartbeat")
    assert beat.status_code == 200
    assert when(beat.json()["last_heartbeat_at"]) > when(before["data"][0]["last_heartbeat_at"])
    assert second != first


def own_worker(client: httpx.Client) -> int | None:
    """A worker registered with ``client``'s token, or None when it may not register."""
    response = client.post(
        "/workers", json={"name": "own", "device_key": DEVICE_KEY, "device": device_document()}
    )
    return int(response.json()["id"]) if response.status_code == 201 else None


@pytest.mark.parametrize(
    ("scope", "allowed"),
    [
        ("read", {"list"}),
        ("write", {"list", "create"}),
        ("worker", {"list", "register", "claim"}),
    ],
)
def test_scopes(connect: Connect, database: Database, scope: str, allowed: set[str]) -> None:
    admin = connect()
    worker = register(admin)
    token = make_token(database, scope, name=scope)
    with httpx.Client(
        base_url=admin.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as client:
        attempts: dict[str, Callable[[], httpx.Response]] = {
            "list": lambda: client.get("/jobs"),
            "create": lambda: client.post("/jobs", json={"target": "m:f", "device": "x"}),
            "register": lambda: client.post(
                "/workers",
                json={"name": "w", "device_key": DEVICE_KEY, "device": device_document()},
            ),
            # For a worker this token registered, where it may register one at all (a
            # token acts only for its own workers: test_worker_identity.py).
            "claim": lambda: client.post(f"/workers/{own_worker(client) or worker}/claim"),
        }
        for action, send in attempts.items():
            status = send().status_code
            if action in allowed:
                assert status < 300, (action, status)
            else:
                assert status == 403, (action, status)
