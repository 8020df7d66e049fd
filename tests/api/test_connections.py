"""`tuner serve` against clients that hold connections open, send too much, or respell one
question: real server processes, real sockets."""

from __future__ import annotations

import selectors
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import httpx
import pytest

from api import migrate
from api.config import ServiceSettings
from api.db import Database
from api.main import create_app
from tests.api.conftest import make_token
from tests.api.documents import sample_profile
from tests.helpers import scaled
from tests.services import ServerThread, tuner_serve

QUESTION = {"workload": "w" * 24, "device": "d" * 24, "global_batch_size": 64}
HALF_A_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: tuner\r\n"  # the headers never end


@pytest.fixture
def served_url(sqlite_url: str) -> str:
    """An SQLite store with one profile behind QUESTION, and its read token."""
    migrate.upgrade(sqlite_url)
    return sqlite_url


def _stored_profile(url: str) -> str:
    """A read token for the store at ``url``, which now holds one profile."""
    database = Database(url)
    try:
        admin = make_token(database, "admin", name="admin")
        reader = make_token(database, "read", name="trainer")
    finally:
        database.dispose()
    app = create_app(ServiceSettings(database_url=url))
    with ServerThread(app) as server:
        profile = sample_profile(max_micro_batch_size=16).model_dump(mode="json")
        response = httpx.post(
            server.url + "/api/v1/profiles",
            json=profile,
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert response.is_success, response.text
    return reader


@contextmanager
def half_open(
    url: str, count: int, *, first: bytes = HALF_A_REQUEST
) -> Iterator[list[socket.socket]]:
    """``count`` connections that each send ``first`` (part of a request) and go quiet."""
    address = urlsplit(url)
    sockets = []
    try:
        for _ in range(count):
            sock = socket.create_connection((address.hostname, address.port), timeout=scaled(30))
            if first:
                sock.sendall(first)
            sockets.append(sock)
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def closed_by_server(
    sockets: list[socket.socket], *, wait_s: float, enough: int | None = None
) -> int:
    """How many of ``sockets`` the server has closed (end of stream or reset), waiting up
    to ``wait_s`` for all of them, or for ``enough`` of them (a server that may keep some
    open would otherwise be waited on until the deadline)."""
    enough = len(sockets) if enough is None else enough
    selector = selectors.DefaultSelector()
    for sock in sockets:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
    closed = 0
    deadline = time.monotonic() + wait_s
    while closed < enough and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=0.5):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                ended = sock.recv(65536) == b""
            except ConnectionError:
                ended = True
            if ended:
                selector.unregister(sock)
                closed += 1
    selector.close()
    return closed


def _still_answers(url: str, token: str) -> None:
    with httpx.Client(base_url=url, timeout=scaled(10)) as client:
        assert client.get("/healthz").status_code == 200
        response = client.get(
            "/api/v1/recommendation",
            params=QUESTION,
            headers={"Authorization": f"Bearer {token}"},
        )
        assert response.status_code == 200, response.text
        assert response.json()["micro_batch_size"] == 16


@pytest.mark.slow
def test_connections_that_never_finish_a_request_are_closed_after_the_timeout(
    served_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = _stored_profile(served_url)
    # Long enough that the test's own questions finish on a busy machine; the held
    # connections never finish, whatever the timeout.
    monkeypatch.setenv("TUNER_REQUEST_TIMEOUT_S", "3")
    with tuner_serve(served_url) as url:
        with (
            half_open(url, 300) as heads,
            half_open(url, 20, first=b"") as silent,
            half_open(url, 20, first=b"GET /heal") as partial_lines,
        ):
            _still_answers(url, token)  # while they are held
            held = heads + silent + partial_lines
            # Without the timeout uvicorn keeps every one of them open for ever.
            assert closed_by_server(held, wait_s=scaled(30)) == len(held)
        _still_answers(url, token)


@pytest.mark.slow
def test_a_process_out_of_room_closes_the_longest_waiting_connections_and_keeps_answering(
    served_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2,000 half-open connections against a process that may hold 200 (and started with
    1,024 open files, which uvicorn alone runs out of): the health check and a training
    job's question are still answered, long before any request timeout."""
    token = _stored_profile(served_url)
    monkeypatch.setenv("TUNER_REQUEST_TIMEOUT_S", "600")
    monkeypatch.setenv("TUNER_MAX_CONNECTIONS", "200")
    with tuner_serve(served_url, open_files=1024) as url, half_open(url, 2_000) as held:
        _still_answers(url, token)
        assert closed_by_server(held, wait_s=scaled(30), enough=2_000 - 200) >= 2_000 - 200


@pytest.mark.slow
def test_a_long_query_string_is_refused_with_414_and_long_headers_with_431(
    served_url: str,
) -> None:
    token = _stored_profile(served_url)
    headers = {"Authorization": f"Bearer {token}"}
    with tuner_serve(served_url) as url, httpx.Client(base_url=url, timeout=30) as client:
        padded = "/api/v1/recommendation?" + "&" * 63_000 + httpx.QueryParams(QUESTION).__str__()
        response = client.get(padded, headers=headers)
        assert response.status_code == 414
        assert response.json()["error"]["code"] == "uri_too_long"
        assert "4096 bytes" in response.json()["error"]["message"]

        response = client.get("/healthz", headers={"X-Padding": "x" * 20_000})
        assert response.status_code == 431
        assert response.json()["error"]["code"] == "headers_too_large"

        many = [(f"x-h{i}", "y" * 50) for i in range(1_000)]  # 56 KB in small headers
        response = client.get("/healthz", headers=many)
        assert response.status_code == 431

        # Within the limits, the same question is answered.
        response = client.get("/api/v1/recommendation", params=QUESTION, headers=headers)
        assert response.status_code == 200


@pytest.mark.slow
def test_a_head_that_never_ends_is_refused_before_it_is_buffered(served_url: str) -> None:
    with tuner_serve(served_url) as url:
        address = urlsplit(url)
        with socket.create_connection((address.hostname, address.port), timeout=scaled(30)) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nX-Long: ")
            answer = b""
            try:
                for _ in range(100):  # 6.4 MB at most, never a newline
                    sock.sendall(b"a" * 65536)
            except ConnectionError:
                pass  # the server answered and hung up while this was still sending
            try:
                while chunk := sock.recv(65536):
                    answer += chunk
            except ConnectionError:
                pass
        assert answer.startswith(b"HTTP/1.1 431"), answer[:200]


@pytest.mark.slow
def test_respelling_one_question_adds_no_cached_answer(
    served_url: str,
) -> None:
    """Padded with ``&``, reordered, a number spelled ``064``: one question, one entry."""
    token = _stored_profile(served_url)
    app = create_app(ServiceSettings(database_url=served_url))
    with (
        ServerThread(app) as server,
        httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        ) as client,
    ):
        spellings = [httpx.QueryParams(QUESTION).__str__()]
        spellings += ["&" * n + spellings[0] for n in range(1, 300)]
        spellings += [
            "global_batch_size=64&device={device}&workload={workload}".format(**QUESTION),
            "workload={workload}&device={device}&global_batch_size=064&world_size=1".format(
                **QUESTION
            ),
        ]
        for spelling in spellings:
            response = client.get("/api/v1/recommendation?" + spelling)
            assert response.status_code == 200, response.text
            assert response.json()["micro_batch_size"] == 16


def _request_lines(lines: list[str], count: int) -> list[str]:
    """The access log's lines once ``count`` have been written (or after 10 s)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        logged = [line for line in lines if " token=" in line]
        if len(logged) >= count:
            return logged
        time.sleep(0.05)
    return [line for line in lines if " token=" in line]


@pytest.mark.slow
def test_each_request_is_logged_with_its_tokens_name_never_the_token_or_the_values(
    served_url: str,
) -> None:
    token = _stored_profile(served_url)
    lines: list[str] = []
    with tuner_serve(served_url, stderr_lines=lines) as url, httpx.Client(base_url=url) as client:
        asked = {"Authorization": f"Bearer {token}"}
        for _ in range(2):
            assert client.get("/api/v1/recommendation", params=QUESTION, headers=asked).is_success
        unknown = {"Authorization": "Bearer not-a-token-of-ours"}
        assert client.get("/api/v1/workloads", headers=unknown).status_code == 401
        logged = _request_lines(lines, 4)  # the start-up health check, and these three
    assert len(logged) == 4, lines
    health, computed, cached, refused = logged
    assert health.startswith("GET /healthz 200 ")
    for line in (computed, cached):
        assert line.startswith("GET /api/v1/recommendation?workload&device&global_batch_size 200 ")
        assert line.rstrip().endswith(" token=trainer")
    assert refused.startswith("GET /api/v1/workloads 401 ")
    assert refused.rstrip().endswith(" token=-")
    everything = "".join(lines)
    assert token not in everything
    assert "not-a-token-of-ours" not in everything
    assert QUESTION["workload"] not in everything  # values stay out


@pytest.mark.slow
def test_no_access_log_turns_it_off(served_url: str) -> None:
    lines: list[str] = []
    with tuner_serve(served_url, "--no-access-log", stderr_lines=lines) as url:
        assert httpx.get(url + "/healthz").status_code == 200
    # The server has stopped: all it wrote is in.
    assert [line for line in lines if " token=" in line] == [], lines


# Slow readers: connections that pipeline requests for a large response and never read.
OPENAPI = b"GET /openapi.json HTTP/1.1\r\nHost: tuner\r\n\r\n"
TCP_CLOSE = 7  # Linux's tcp_info.tcpi_state once a reset has arrived


@contextmanager
def not_reading(url: str, count: int, *, pipelined: int = 40) -> Iterator[list[socket.socket]]:
    """``count`` connections that each send ``pipelined`` requests at once and never read
    an answer. A small receive buffer and segment size keep the kernel's send queue for
    each small (about 100 KB, against megabytes on loopback otherwise), so the server's
    writes back up within two answers, as they do for a far client."""
    address = urlsplit(url)
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
            # Generous: a busy machine's server takes a while to make room for the next.
            sock.settimeout(scaled(30))
            sock.connect((address.hostname, address.port))
            sock.sendall(OPENAPI * pipelined)
            sockets.append(sock)
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def reset_by_server(
    sockets: list[socket.socket], *, wait_s: float, enough: int | None = None
) -> int:
    """How many of ``sockets`` the server has reset, read from the kernel's state of each
    (reading would drain what the server is waiting to write), waiting up to ``wait_s``
    for ``enough`` of them (default: all)."""
    deadline = time.monotonic() + wait_s
    while True:
        reset = sum(
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == TCP_CLOSE
            for sock in sockets
        )
        if reset >= (enough or len(sockets)) or time.monotonic() > deadline:
            return reset
        time.sleep(0.2)


def healthz_seconds(url: str) -> float:
    started = time.perf_counter()
    assert httpx.get(url + "/healthz", timeout=scaled(5)).status_code == 200
    return time.perf_counter() - started


@pytest.mark.slow
def test_a_connection_that_never_reads_its_answers_is_closed_after_the_write_timeout(
    served_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 pipelined requests for the OpenAPI document (about 70 KB each) and nothing
    read: without a write deadline uvicorn waits on each connection for ever."""
    monkeypatch.setenv("TUNER_WRITE_TIMEOUT_S", "1")
    with tuner_serve(served_url) as url, not_reading(url, 20) as held:
        assert healthz_seconds(url) < scaled(5)
        assert reset_by_server(held, wait_s=scaled(15)) == len(held)
        assert healthz_seconds(url) < scaled(5)


@pytest.mark.slow
def test_pipelined_requests_past_the_bound_are_dropped_and_the_connection_closed(
    served_url: str,
) -> None:
    """A client that reads gets the first 1 + 16 answers, then the server hangs up (the
    client retries the rest on a new connection, as HTTP/1.1 says)."""
    with tuner_serve(served_url) as url:
        address = urlsplit(url)
        with socket.create_connection((address.hostname, address.port), timeout=scaled(30)) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: tuner\r\n\r\n" * 100)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        assert answer.count(b"HTTP/1.1 200 OK") == 17, answer[-300:]
        assert answer.count(b"connection: close") == 1


@pytest.mark.slow
def test_slow_readers_past_the_connection_limit_leave_the_health_check_answered(
    served_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's 2,700 × 40 case, scaled down: 300 connections that pipeline 40 requests
    and never read, against a process allowed 100. Connections stuck writing are closed
    for room like those stuck reading, long before any write timeout: the process holds
    no more than its limit, and the health check and a question are answered."""
    token = _stored_profile(served_url)
    monkeypatch.setenv("TUNER_WRITE_TIMEOUT_S", "600")
    monkeypatch.setenv("TUNER_MAX_CONNECTIONS", "100")
    with tuner_serve(served_url) as url, not_reading(url, 300) as held:
        latencies = [healthz_seconds(url) for _ in range(5)]
        _still_answers(url, token)
        assert max(latencies) < scaled(5)
        assert reset_by_server(held, wait_s=scaled(30), enough=300 - 100) >= 300 - 100


@pytest.mark.slow
def test_forwarded_headers_are_trusted_only_from_the_proxy_named(served_url: str) -> None:
    """Behind a TLS proxy the dashboard must know it was reached over HTTPS (its cookie is
    ``Secure``); with nothing in front, no client may claim so."""
    proxied = {"Host": "tuner.example.org", "X-Forwarded-Proto": "https"}
    warning = "came over plain HTTP from another machine"
    with tuner_serve(served_url) as url:
        page = httpx.get(url + "/login", headers=proxied)
        assert page.status_code == 200
        assert warning in page.text  # uvicorn alone trusts 127.0.0.1
    with tuner_serve(served_url, "--forwarded-allow-ips", "127.0.0.1") as url:
        page = httpx.get(url + "/login", headers=proxied)
        assert page.status_code == 200
        assert warning not in page.text
