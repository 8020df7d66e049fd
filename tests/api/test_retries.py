"""A request the service did but whose answer was lost is not done twice by the client's
retries: through a real TCP proxy that forwards a POST to the real service and then drops
the answer (closes the connection) or answers 502 in its place, as a proxy whose upstream
timed out does. Over SQLite and PostgreSQL."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from api.db import Database
from tests.api.conftest import make_token
from tests.api.jobs_helpers import DEVICE_NAME, device_document
from tests.services import ServerThread
from tuner.client import TunerClient
from tuner.client.transport import Transport
from tuner.core.errors import ServiceUnavailableError
from tuner.core.results import DeviceInfo
from tuner.worker.allow import AllowList
from tuner.worker.loop import DeviceIdentity, Worker

_GATEWAY_PAGE = b"<html><body><h1>502 Bad Gateway</h1></body></html>"


def _read_message(stream: socket.socket, buffer: bytearray) -> bytes | None:
    """One HTTP/1.1 message (head and ``Content-Length`` body) from ``stream``; None at
    the end of the stream."""
    while b"\r\n\r\n" not in buffer:
        chunk = stream.recv(65536)
        if not chunk:
            return None
        buffer += chunk
    head_end = buffer.index(b"\r\n\r\n") + 4
    length = 0
    for line in bytes(buffer[:head_end]).split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(buffer) < head_end + length:
        chunk = stream.recv(65536)
        if not chunk:
            return None
        buffer += chunk
    message = bytes(buffer[: head_end + length])
    del buffer[: head_end + length]
    return message


class LossyProxy:
    """A TCP proxy on loopback in front of the service. Each request is forwarded and its
    answer relayed, except the first answer to ``method path``: the service has done that
    request, and the client gets no answer (``drop``) or a gateway's 502 (``502``)."""

    def __init__(self, upstream_port: int, *, method: str, path: str, fault: str) -> None:
        self.upstream_port = upstream_port
        self.target = f"{method} {path} ".encode()
        self.fault = fault
        self.lost = 0
        self.forwarded: list[bytes] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        buffer = bytearray()
        with client:
            while (request := _read_message(client, buffer)) is not None:
                with socket.create_connection(("127.0.0.1", self.upstream_port)) as upstream:
                    upstream.sendall(request)
                    answer = _read_message(upstream, bytearray())
                assert answer is not None, "the service closed the connection without answering"
                with self._lock:
                    self.forwarded.append(request.split(b"\r\n", 1)[0])
                    lose = request.startswith(self.target) and self.lost == 0
                    self.lost += lose
                if not lose:
                    client.sendall(answer)
                    continue
                if self.fault == "502":
                    client.sendall(
                        b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\n"
                        + f"Content-Length: {len(_GATEWAY_PAGE)}\r\n".encode()
                        + b"Connection: close\r\n\r\n"
                        + _GATEWAY_PAGE
                    )
                return  # the connection closes: a dropped answer, or after the 502


@pytest.fixture(params=["drop", "502"])
def fault(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


def _proxy(service: ServerThread, method: str, path: str, fault: str) -> Iterator[LossyProxy]:
    proxy = LossyProxy(service.port, method=method, path=path, fault=fault)
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
def jobs_proxy(service: ServerThread, fault: str) -> Iterator[LossyProxy]:
    yield from _proxy(service, "POST", "/api/v1/jobs", fault)


@pytest.fixture
def workers_proxy(service: ServerThread, fault: str) -> Iterator[LossyProxy]:
    yield from _proxy(service, "POST", "/api/v1/workers", fault)


def _listed(http: httpx.Client, what: str) -> list[dict[str, Any]]:
    response = http.get(f"/api/v1/{what}")
    assert response.status_code == 200, response.text
    data: list[dict[str, Any]] = response.json()["data"]
    return data


def test_a_job_whose_answer_was_lost_is_queued_once(
    http: httpx.Client, jobs_proxy: LossyProxy, admin_token: str
) -> None:
    with TunerClient(jobs_proxy.url, token=admin_token, retries=3, backoff=0.01) as client:
        job = client.queue_job("examples.gpt:workload", device=DEVICE_NAME)
    assert jobs_proxy.lost == 1  # the first try was done, and its answer lost
    assert jobs_proxy.forwarded.count(b"POST /api/v1/jobs HTTP/1.1") == 2  # and retried
    assert [stored["id"] for stored in _listed(http, "jobs")] == [job.id]


def test_a_worker_whose_registration_answer_was_lost_is_registered_once(
    http: httpx.Client, workers_proxy: LossyProxy, database: Database
) -> None:
    identity = DeviceIdentity(
        device="cpu", key="k" * 24, info=DeviceInfo.model_validate(device_document())
    )
    log: list[str] = []
    worker = Worker(
        url=workers_proxy.url,
        token=make_token(database, "worker", name="host-1"),
        identity=identity,
        name="host-1",
        allow=AllowList(("tests",)),
        poll_interval=0.05,
        log=log.append,
    )
    try:
        worker_id = worker.register()
    finally:
        worker.close()
    assert workers_proxy.lost == 1
    assert [stored["id"] for stored in _listed(http, "workers")] == [worker_id]


def test_a_post_without_a_key_is_not_retried_once_it_may_have_been_done(
    http: httpx.Client, jobs_proxy: LossyProxy, admin_token: str
) -> None:
    transport = Transport(jobs_proxy.url, token=admin_token, retries=3, backoff=0.01)
    body = {"target": "examples.gpt:workload", "device": DEVICE_NAME}
    try:
        with pytest.raises(ServiceUnavailableError):
            transport.request("POST", "/api/v1/jobs", json=body)
    finally:
        transport.close()
    assert len(_listed(http, "jobs")) == 1  # done once, by the one try that was sent


def test_replays_answer_200_with_the_same_job_and_a_changed_body_409(http: httpx.Client) -> None:
    body = {"target": "examples.gpt:workload", "device": DEVICE_NAME, "idempotency_key": "job-0001"}
    first = http.post("/api/v1/jobs", json=body)
    again = http.post("/api/v1/jobs", json=body)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    changed = http.post("/api/v1/jobs", json={**body, "options": {"seq_len": 64}})
    assert changed.status_code == 409, changed.text
    assert "belongs to another job" in changed.json()["error"]["message"]
    assert len(_listed(http, "jobs")) == 1
