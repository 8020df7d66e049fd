"""Per-token limits on writes, over real HTTP on a real uvicorn server: the write over the
rate is a 429 with ``Retry-After``, other tokens and every read go on, and the service
keeps answering reads while one client floods it with writes."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from api.config import ServiceSettings
from api.main import create_app
from tests.api.builders import upload
from tests.api.conftest import make_token
from tests.api.documents import sample_profile
from tests.services import ServerThread
from tuner.core.errors import BadInputError

RATE = 10  # writes a minute: small, so that a test reaches it at once


@pytest.fixture
def limited(migrated_url: str) -> Iterator[ServerThread]:
    app = create_app(ServiceSettings(database_url=migrated_url, write_rate_limit=f"{RATE}/minute"))
    with ServerThread(app) as server:
        yield server


def _client(server: ServerThread, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def _oom(client: httpx.Client) -> httpx.Response:
    body = {"workload": "gpt-test", "device": "cpu-test", "micro_batch_size": 64}
    return client.post("/api/v1/oom-reports", json=body)


def test_a_write_over_the_rate_is_429_with_retry_after(limited, database) -> None:
    noisy, quiet = make_token(database, "write", name="noisy"), make_token(database, "write")
    with _client(limited, noisy) as client, _client(limited, quiet) as other:
        upload(client, sample_profile())  # one write
        statuses = [_oom(client).status_code for _ in range(RATE)]
        assert statuses == [201] * (RATE - 1) + [429]
        refused = _oom(client)
        assert refused.status_code == 429
        wait = int(refused.headers["Retry-After"])
        assert 1 <= wait <= 60
        message = refused.json()["error"]["message"]
        assert f"token 'noisy' has made {RATE}/minute writes: wait {wait} s" in message
        # Reads by the same token, and writes by another, are not limited.
        assert client.get("/api/v1/profiles").status_code == 200
        assert _oom(other).status_code == 201


@pytest.mark.slow
def test_reads_keep_their_pace_while_one_client_floods_writes(limited, database) -> None:
    flooder, reader_token = make_token(database, "write"), make_token(database, "read")
    with _client(limited, flooder) as client:
        upload(client, sample_profile())
    query = {"workload": "gpt-test", "device": "cpu-test", "global_batch_size": 64}

    def read_times(reader: httpx.Client, count: int) -> list[float]:
        times = []
        for index in range(count):
            start = time.perf_counter()
            # Distinct questions: every one misses the answer cache.
            response = reader.get(
                "/api/v1/recommendation", params={**query, "global_batch_size": 64 + index}
            )
            times.append(time.perf_counter() - start)
            assert response.status_code == 200, response.text
        return times

    with _client(limited, reader_token) as reader:
        quiet = read_times(reader, 40)
        stop = threading.Event()
        refused = [0]

        def flood() -> None:
            with _client(limited, flooder) as writer:
                while not stop.is_set():
                    refused[0] += _oom(writer).status_code == 429

        flooders = [threading.Thread(target=flood) for _ in range(4)]
        for thread in flooders:
            thread.start()
        try:
            time.sleep(0.2)
            flooded = read_times(reader, 40)
        finally:
            stop.set()
            for thread in flooders:
                thread.join(timeout=30)
    assert refused[0] > 40  # the flood was refused, cheaply, from the limit on
    # Four flooding clients share the server with the reader: its reads may slow by the
    # share they take, never stall.
    assert statistics.median(flooded) < 5 * statistics.median(quiet) + 0.05
    assert max(flooded) < 2.0


def test_a_bad_rate_setting_is_one_clear_line() -> None:
    with pytest.raises(BadInputError, match="is not a rate: give e"):
        ServiceSettings(write_rate_limit="lots")
    assert ServiceSettings(write_rate_limit="none").write_rate_limit == "none"
