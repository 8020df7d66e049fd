"""Many writers and readers at once through the real HTTP service, on SQLite and on
PostgreSQL: 8 writers post 60 profiles each while readers list and ask for
recommendations. Every profile is stored exactly once; no request fails, none with a 5xx
or "database is locked"."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest

from tests.api.builders import at, upload
from tests.api.documents import sample_profile
from tests.services import tuner_serve

# The store is the subject: SQLite and PostgreSQL.
pytestmark = pytest.mark.both_stores

WRITERS = 8
# Enough for every writer's first uploads of a shared key to race the others' and for reads
# to interleave with hundreds of writes; sustained throughput is bench/service.py's.
PROFILES_EACH = 60
READERS = 2
# Writers share workloads and devices, so first uploads of one key race each other.
WORKLOADS = [(f"{i}" * 24, f"workload-{i}") for i in range(4)]
DEVICES = [(f"{c}" * 24, f"device-{c}") for c in "xy"]


@pytest.fixture
def served(migrated_url: str) -> Iterator[str]:
    """`tuner serve` in its own process, as deployed: the test's client threads then do
    not share an interpreter lock with the server."""
    # Thousands of writes from one token in seconds: what is tested here is that none is
    # lost or doubled, so the per-token write limit is off.
    with tuner_serve(migrated_url, "--write-rate-limit", "none") as url:
        yield url


def _profile_document(writer: int, index: int) -> dict[str, Any]:
    workload_key, workload_name = WORKLOADS[(writer + index) % len(WORKLOADS)]
    device_key, device_name = DEVICES[index % len(DEVICES)]
    profile = sample_profile(
        max_micro_batch_size=1 + (writer * PROFILES_EACH + index) % 32,
        workload_key=workload_key,
        workload_name=workload_name,
        device_key=device_key,
        device_name=device_name,
        # Distinct times: each document is a different measurement.
        created_at=at(0) + timedelta(milliseconds=writer * PROFILES_EACH + index),
    )
    return profile.model_dump(mode="json")


@pytest.mark.slow
def test_writers_and_readers_at_once_lose_and_duplicate_nothing(
    served: str, admin_token: str
) -> None:
    headers = {"Authorization": f"Bearer {admin_token}"}
    http = httpx.Client(base_url=served, headers=headers, timeout=60)
    upload(http, sample_profile(max_micro_batch_size=8))  # so readers always get an answer
    # Bodies are encoded up front, so the clock measures the service, not the test.
    bodies = [
        [json.dumps(_profile_document(w, i)).encode() for i in range(PROFILES_EACH)]
        for w in range(WRITERS)
    ]
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(WRITERS + READERS)
    writers_done = threading.Event()

    def record(response: httpx.Response) -> None:
        with lock:
            statuses[response.status_code] += 1
            if response.status_code >= 400:
                failures.append(f"{response.status_code} {response.text[:300]}")

    def write(writer: int) -> None:
        json_headers = {**headers, "Content-Type": "application/json"}
        with httpx.Client(base_url=served, headers=json_headers, timeout=60) as client:
            start.wait()
            for body in bodies[writer]:
                record(client.post("/api/v1/profiles", content=body))

    def read(reader: int) -> None:
        with httpx.Client(base_url=served, headers=headers, timeout=60) as client:
            start.wait()
            # A short pause between rounds: reads keep interleaving with the writes without
            # taking most of the one server process's time from them.
            while not writers_done.wait(0.01):
                record(client.get("/api/v1/profiles", params={"limit": 20}))
                record(
                    client.get(
                        "/api/v1/profiles",
                        params={"workload": WORKLOADS[reader][1], "device": DEVICES[0][0]},
                    )
                )
                record(
                    client.get(
                        "/api/v1/recommendation",
                        params={
                            "workload": "gpt-test",
                            "device": "cpu-test",
                            "global_batch_size": 64,
                            "policy": "even",
                        },
                    )
                )

    writers = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
    readers = [threading.Thread(target=read, args=(r,)) for r in range(READERS)]
    began = time.perf_counter()
    for thread in writers + readers:
        thread.start()
    for thread in writers:
        thread.join()
    elapsed = time.perf_counter() - began
    writers_done.set()
    for thread in readers:
        thread.join()

    assert failures == []
    assert statuses[201] == WRITERS * PROFILES_EACH
    assert set(statuses) <= {200, 201}
    reads = statuses[200]
    rate = WRITERS * PROFILES_EACH / elapsed
    print(
        f"\n{WRITERS * PROFILES_EACH} profiles in {elapsed:.1f} s ({rate:.0f}/s) "
        f"with {reads} reads alongside"
    )

    ids: list[int] = []
    times: list[tuple[str, str]] = []
    token = None
    while True:
        params: dict[str, Any] = {"limit": 500}
        if token:
            params["next_page_token"] = token
        page = http.get("/api/v1/profiles", params=params).json()
        assert page["count"] == WRITERS * PROFILES_EACH + 1
        ids += [row["id"] for row in page["data"]]
        times += [(row["workload_key"], row["created_at"]) for row in page["data"]]
        token = page["next_page_token"]
        if token is None:
            break
    assert len(ids) == len(set(ids)) == WRITERS * PROFILES_EACH + 1
    assert len(set(times)) == len(times)
    assert http.get("/api/v1/devices").json()["count"] == len(DEVICES) + 1
    assert http.get("/api/v1/workloads").json()["count"] == len(WORKLOADS) + 1
    http.close()
