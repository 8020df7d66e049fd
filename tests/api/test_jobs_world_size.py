"""A profiling job that asks for a world size and a parallel mode is claimed only by a
worker with that many ranks (devices, or processes on a CPU); the rest leave it queued and
the job says what it waits for."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from api.db import Database
from tests.api.conftest import make_token
from tests.api.jobs_helpers import api_client, claim, get_job, job_service, queue, register


@pytest.fixture
def client(migrated_url: str, database: Database) -> Iterator[httpx.Client]:
    token = make_token(database, "admin", name="admin")
    with job_service(migrated_url) as server, api_client(server, token) as connected:
        yield connected


def _claim(client: httpx.Client, worker_id: int, ranks: int) -> int | None:
    response = client.post(f"/workers/{worker_id}/claim", params={"ranks": ranks})
    assert response.status_code in (200, 204), response.text
    return response.json()["job"]["id"] if response.status_code == 200 else None


def test_a_job_on_four_ranks_waits_for_a_worker_with_four(client: httpx.Client) -> None:
    ddp = queue(client, settings={"world_size": 4, "parallel": "ddp"})
    assert (ddp["settings"]["world_size"], ddp["settings"]["parallel"]) == (4, "ddp")
    plain = queue(client)
    small = register(client, "small")
    large = register(client, "large")

    # The older job needs four ranks: the two-rank worker passes over it to the next one.
    assert _claim(client, small, ranks=2) == plain["id"]
    assert _claim(client, small, ranks=2) is None
    waiting = get_job(client, ddp["id"])
    assert waiting["status"] == "queued"
    assert waiting["error"] == (
        "waiting for a worker with 4 ranks: worker 'small' has 2 (devices, or processes on "
        "a CPU); start one with `tuner worker --ranks 4`"
    )
    # A worker that does not say how many ranks it has is taken to have one.
    assert claim(client, small) is None
    assert _claim(client, large, ranks=4) == ddp["id"]
    assert get_job(client, ddp["id"])["status"] == "running"


def test_one_process_jobs_need_one_rank_whatever_their_world_size(client: httpx.Client) -> None:
    job = queue(client, settings={"world_size": 8, "parallel": "none"})
    worker = register(client)
    assert _claim(client, worker, ranks=1) == job["id"]


def test_a_bad_world_size_or_mode_is_refused(client: httpx.Client) -> None:
    for settings, says in (
        ({"world_size": 0}, "greater than or equal to 1"),
        ({"parallel": "zero"}, "'none', 'ddp' or 'fsdp'"),
    ):
        response = client.post(
            "/jobs", json={"target": "examples.gpt:workload", "device": "cpu", "settings": settings}
        )
        assert response.status_code == 422, response.text
        assert says in response.text
    assert client.get("/jobs").json()["count"] == 0
