"""Helpers for the job and worker tests: a service with chosen lease settings, and the
few requests every test makes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from api.config import ServiceSettings
from api.main import create_app
from tests.api.documents import sample_profile
from tests.services import ServerThread
from tuner.core.results import Profile

DEVICE_KEY = "d" * 24
DEVICE_NAME = "cpu-test"
TARGET = "examples.gpt:workload"  # what sample_profile() says it profiled


@contextmanager
def job_service(database_url: str, **settings: Any) -> Iterator[ServerThread]:
    """The real service over ``database_url`` with ``settings`` (lease_seconds, ...)."""
    app = create_app(ServiceSettings(database_url=database_url, **settings))
    with ServerThread(app) as server:
        yield server


@contextmanager
def api_client(server: ServerThread, token: str) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=f"{server.url}/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as client:
        yield client


def device_document(name: str = DEVICE_NAME) -> dict[str, Any]:
    return sample_profile(device_name=name).device.model_dump(mode="json")


def register(
    client: httpx.Client,
    name: str = "worker",
    *,
    device_key: str = DEVICE_KEY,
    device_name: str = DEVICE_NAME,
) -> int:
    response = client.post(
        "/workers",
        json={"name": name, "device_key": device_key, "device": device_document(device_name)},
    )
    assert response.status_code == 201, response.text
    worker_id: int = response.json()["id"]
    return worker_id


def queue(
    client: httpx.Client, *, device: str = DEVICE_NAME, target: str = TARGET, **body: Any
) -> dict[str, Any]:
    response = client.post("/jobs", json={"target": target, "device": device, **body})
    assert response.status_code == 201, response.text
    job: dict[str, Any] = response.json()
    return job


def claim(client: httpx.Client, worker_id: int) -> dict[str, Any] | None:
    """The claim (``{"job", "lease"}``), or None when the service has nothing (204)."""
    response = client.post(f"/workers/{worker_id}/claim")
    if response.status_code == 204:
        assert response.content == b""
        return None
    assert response.status_code == 200, response.text
    claimed: dict[str, Any] = response.json()
    return claimed


def profile_document(profile: Profile | None = None) -> dict[str, Any]:
    """A profile as the engine prints it (computed ``peak_bytes`` included)."""
    return (profile or sample_profile()).model_dump(mode="json")


def get_job(client: httpx.Client, job_id: int) -> dict[str, Any]:
    response = client.get(f"/jobs/{job_id}")
    assert response.status_code == 200, response.text
    job: dict[str, Any] = response.json()
    return job


def wait_for(
    what: str, check: Callable[[], Any], *, timeout: float = 60.0, interval: float = 0.1
) -> Any:
    """Poll ``check`` until it returns something truthy; fail with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
