"""A worker is bound to the token that registered it: another worker's token can neither
heartbeat it, claim for it, nor heartbeat, finish or fail the jobs it holds (403, and
nothing changes), over real HTTP. An admin may act for any."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from api.db import Database
from tests.api.builders import error_of
from tests.api.conftest import make_token
from tests.api.jobs_helpers import (
    api_client,
    claim,
    get_job,
    profile_document,
    queue,
    register,
)
from tests.services import ServerThread

FOREIGN = "was registered with another token: a token acts only for the workers it registered"


@pytest.fixture
def two_workers(service: ServerThread, database: Database) -> dict[str, Any]:
    """Workers "a" and "b", each registered with a token of its own; "a" holds a job."""
    tokens = {name: make_token(database, "worker", name=f"worker-{name}") for name in "ab"}
    ids = {}
    for name, token in tokens.items():
        with api_client(service, token) as client:
            ids[name] = register(client, f"host-{name}")
    with api_client(service, make_token(database, "write")) as writer:
        job = queue(writer)
    with api_client(service, tokens["a"]) as client:
        held = claim(client, ids["a"])
    assert held is not None
    return {"tokens": tokens, "ids": ids, "job": job["id"], "lease": held["lease"]["lease_id"]}


def _refused(response: httpx.Response) -> None:
    assert FOREIGN in error_of(response, 403)["message"]


def test_another_workers_token_is_refused_everything_and_changes_nothing(
    service: ServerThread, two_workers: dict[str, Any]
) -> None:
    ids, job, lease = two_workers["ids"], two_workers["job"], two_workers["lease"]
    with api_client(service, two_workers["tokens"]["b"]) as b:
        before = get_job(b, job)
        _refused(b.post(f"/workers/{ids['a']}/heartbeat"))
        _refused(b.post(f"/workers/{ids['a']}/claim"))
        _refused(b.post(f"/jobs/{job}/heartbeat", json={"lease_id": lease}))
        result = {"lease_id": lease, "profile": profile_document()}
        _refused(b.post(f"/jobs/{job}/result", json=result))
        failure = {"lease_id": lease, "reason": "not mine", "retryable": False}
        _refused(b.post(f"/jobs/{job}/failure", json=failure))
        after = get_job(b, job)
        assert (after["status"], after["attempts"], after["error"]) == (
            before["status"],
            before["attempts"],
            before["error"],
        )
        # Its own worker is its to run.
        assert b.post(f"/workers/{ids['b']}/heartbeat").status_code == 200
    with api_client(service, two_workers["tokens"]["a"]) as a:
        assert a.post(f"/jobs/{job}/heartbeat", json={"lease_id": lease}).status_code == 200
        done = a.post(
            f"/jobs/{job}/result", json={"lease_id": lease, "profile": profile_document()}
        )
        assert done.status_code == 200, done.text
        assert done.json()["status"] == "succeeded"


def test_an_admin_may_act_for_any_worker(
    service: ServerThread, database: Database, two_workers: dict[str, Any]
) -> None:
    job, lease = two_workers["job"], two_workers["lease"]
    with api_client(service, make_token(database, "admin")) as admin:
        failure = {"lease_id": lease, "reason": "stopped by an operator", "retryable": False}
        response = admin.post(f"/jobs/{job}/failure", json=failure)
        assert response.status_code == 200, response.text
        assert response.json()["status"] == "failed"


def test_a_device_named_like_anothers_does_not_take_its_jobs(
    service: ServerThread, database: Database
) -> None:
    """An attacker's worker token registers a device of its own under the name of the
    fleet's device; a job queued for that name goes to the fleet's worker, never to it."""
    fleet = make_token(database, "worker", name="fleet")
    attacker = make_token(database, "worker", name="attacker")
    with api_client(service, fleet) as client:
        fleet_worker = register(client, "gpu-host")
    with api_client(service, attacker) as client:
        forged = register(client, "forged", device_key="f" * 24)
    with api_client(service, make_token(database, "write", name="owner")) as writer:
        job = queue(writer)  # by the device's name, as people queue them
    with api_client(service, attacker) as client:
        assert claim(client, forged) is None
    with api_client(service, fleet) as client:
        held = claim(client, fleet_worker)
    assert held is not None
    assert held["job"]["id"] == job["id"]


def test_a_result_must_name_the_jobs_target(
    service: ServerThread, two_workers: dict[str, Any]
) -> None:
    """A result without a target (or with another) is refused: it could be any workload,
    stored in the name of whoever queued the job. Nothing is stored; the job stays held."""
    job, lease = two_workers["job"], two_workers["lease"]
    with api_client(service, two_workers["tokens"]["a"]) as a:
        for target in (None, "examples.mlp:workload"):
            document = profile_document()
            document["workload"]["target"] = target
            refused = a.post(f"/jobs/{job}/result", json={"lease_id": lease, "profile": document})
            assert "send the profile this job produced" in error_of(refused, 422)["message"]
        assert a.get("/profiles").json()["count"] == 0
        assert get_job(a, job)["status"] == "running"
