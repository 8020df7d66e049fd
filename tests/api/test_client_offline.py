"""The client when the service cannot be reached: the last answer to the same question from
the disk cache, else the caller's fallback, each with exactly one warning; with neither, a
quick ServiceUnavailableError. Answers the service gives (401, 404, 422) are never masked.
Real servers throughout, stopped or misbehaving for real."""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from api import migrate
from api.config import ServiceSettings
from api.db import Database
from api.main import create_app
from tests.api.conftest import make_token
from tests.api.documents import sample_profile
from tests.helpers import scaled
from tests.services import ServerThread, free_port
from tuner.client import (
    CachedRecommendation,
    OfflineRecommendation,
    TunerClient,
    TunerClientWarning,
    TunerOfflineWarning,
)
from tuner.core.errors import (
    AuthenticationError,
    BadInputError,
    ServiceUnavailableError,
    TunerError,
)
from tuner.core.plan import Recommendation

QUESTION: dict[str, Any] = {"workload": "gpt-test", "device": "cpu-test", "global_batch_size": 40}
# Few retries: an outage (a refused connection) must cost a training job little time. The
# timeout stays generous: a live service on a busy machine may take seconds to answer, and
# only the tests of a hung service need a short one (and set it themselves).
QUICK: dict[str, Any] = {"timeout": 30.0, "retries": 1, "backoff": 0.01}


class Service:
    """The real service over an SQLite file, which a test may stop and start again."""

    def __init__(self, url: str) -> None:
        self.database_url = url
        migrate.upgrade(url)
        database = Database(url)
        try:
            self.token = make_token(database, "admin")
            self.reader = make_token(database, "read", name="reader")
        finally:
            database.dispose()
        self.server: ServerThread | None = None
        self.url = ""
        self.start()

    def start(self) -> None:
        self.server = ServerThread(create_app(ServiceSettings(database_url=self.database_url)))
        self.server.__enter__()
        self.url = self.server.url

    def stop(self) -> None:
        if self.server is not None:
            self.server.__exit__(None, None, None)
            self.server = None


@pytest.fixture
def service(sqlite_url: str) -> Iterator[Service]:
    running = Service(sqlite_url)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def client(service: Service, tmp_path: Path) -> Iterator[TunerClient]:
    with TunerClient(service.url, token=service.token, cache_dir=tmp_path / "cache", **QUICK) as c:
        c.upload_profile(sample_profile())
        yield c


def test_the_cached_answer_with_one_warning_when_the_service_is_gone(
    service: Service, client: TunerClient
) -> None:
    fresh = client.recommend(**QUESTION)
    assert type(fresh) is not CachedRecommendation
    files = list(client.cache_dir.iterdir())
    assert len(files) == 1
    assert files[0].suffix == ".json"
    service.stop()

    started = time.monotonic()
    with pytest.warns(TunerOfflineWarning) as caught:
        cached = client.recommend(**QUESTION)
    assert time.monotonic() - started < scaled(5)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "cannot reach the service" in message
    assert "from the offline cache" in message
    assert caught[0].filename == __file__  # it points at the caller's line
    assert isinstance(cached, CachedRecommendation)
    assert "cannot reach the service" in cached.offline_reason
    same = {"profile_age_s", "cached_at", "offline_reason"}
    assert cached.model_dump(exclude=same) == fresh.model_dump(exclude=same)
    assert cached.profile_age_s >= fresh.profile_age_s

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same question again: no second warning
        again = client.recommend(**QUESTION)
    assert again.model_dump(exclude={"profile_age_s"}) == cached.model_dump(
        exclude={"profile_age_s"}
    )

    # Another process (another client) finds the answer on disk, and warns once itself.
    with (
        TunerClient(service.url, cache_dir=client.cache_dir, **QUICK) as other,
        pytest.warns(TunerOfflineWarning),
    ):
        assert other.recommend(**QUESTION).micro_batch_size == fresh.micro_batch_size


def test_the_fallback_with_one_warning_for_a_question_never_answered(
    service: Service, client: TunerClient
) -> None:
    client.recommend(**QUESTION)
    service.stop()
    other = {**QUESTION, "global_batch_size": 64, "world_size": 2}
    with pytest.warns(TunerOfflineWarning, match="the fallback is used") as caught:
        answer = client.recommend(**other, fallback=(5, 7))
    assert len(caught) == 1
    assert isinstance(answer, OfflineRecommendation)
    assert (answer.micro_batch_size, answer.grad_accum, answer.flat_split()) == (
        5,
        7,
        [5] * 6 + [2],
    )
    assert (answer.per_rank_batch_size, answer.world_size, answer.basis) == (32, 2, "estimated")
    assert (answer.workload, answer.device) == ("gpt-test", "cpu-test")
    assert "cannot reach the service" in answer.offline_reason
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert client.recommend(**other, fallback=(5, 7)) == answer
    assert client.oom_reporter(answer).workload == "gpt-test"  # reports go where it asked
    with pytest.raises(BadInputError, match="say what to report on"):
        client.oom_reporter()

    # A whole recommendation for the same batch is a fallback too.
    given = Recommendation(
        micro_batch_size=16,
        grad_accum=4,
        split=[16, 16, 16, 16],
        global_batch_size=128,
        world_size=2,
        per_rank_batch_size=64,
        policy="even",
        max_micro_batch_size=20,
        expected_peak_bytes=None,
        expected_samples_per_second=None,
        basis="measured",
    )
    question = {**QUESTION, "global_batch_size": 128, "world_size": 2, "policy": "even"}
    with pytest.warns(TunerOfflineWarning):
        kept = client.recommend(**question, fallback=given)
    assert kept.model_dump(include=set(Recommendation.model_fields)) == given.model_dump()


def test_a_cached_answer_comes_before_the_fallback(service: Service, client: TunerClient) -> None:
    fresh = client.recommend(**QUESTION)
    service.stop()
    with pytest.warns(TunerOfflineWarning, match="offline cache"):
        answer = client.recommend(**QUESTION, fallback=(1, 40))
    assert isinstance(answer, CachedRecommendation)
    assert answer.micro_batch_size == fresh.micro_batch_size


def test_with_neither_the_outage_is_raised_quickly_and_says_what_to_do(
    service: Service, client: TunerClient
) -> None:
    service.stop()
    started = time.monotonic()
    with pytest.raises(ServiceUnavailableError, match=r"is cached in .*pass fallback="):
        client.recommend(**QUESTION)
    assert time.monotonic() - started < scaled(5)


def test_a_wrong_fallback_is_refused_at_once_even_with_the_service_up(
    client: TunerClient,
) -> None:
    with pytest.raises(BadInputError, match="grad_accum must be 5"):
        client.recommend(**QUESTION, fallback=(8, 4))
    with pytest.raises(BadInputError, match="micro batch size must be at least 1"):
        client.recommend(**QUESTION, fallback=(0, 1))
    with pytest.raises(BadInputError, match="fallback is for global batch 128 over 1 ranks"):
        client.recommend(
            **QUESTION,
            fallback=Recommendation(
                micro_batch_size=16,
                grad_accum=8,
                split=[16] * 8,
                global_batch_size=128,
                world_size=1,
                per_rank_batch_size=128,
                policy="max",
                max_micro_batch_size=16,
                expected_peak_bytes=None,
                expected_samples_per_second=None,
                basis="measured",
            ),
        )


def test_answers_from_the_service_are_never_masked_by_the_cache(
    service: Service, client: TunerClient
) -> None:
    client.recommend(**QUESTION)  # cached
    with (
        TunerClient(service.url, token="mbt_forged", cache_dir=client.cache_dir, **QUICK) as forged,
        pytest.raises(AuthenticationError),
    ):
        forged.recommend(**QUESTION)
    with pytest.raises(BadInputError, match="not divisible by world size 3"):
        client.recommend(**{**QUESTION, "world_size": 3}, fallback=(1, 40))


class Gateway:
    """A reverse proxy on loopback in front of the service, like the one a deployment puts
    there; told to, it answers 502 with its own HTML page, or hangs, or serves a web page
    as if the URL were some other site."""

    def __init__(self, upstream: str) -> None:
        self.mode = "proxy"
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if gateway.mode == "hang":
                    time.sleep(2)
                    return
                if gateway.mode in ("502", "page"):
                    body = b"<html><body><h1>Hello</h1></body></html>"
                    self.send_response(502 if gateway.mode == "502" else 200)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                headers = {"Authorization": self.headers.get("Authorization", "")}
                answer = httpx.get(upstream + self.path, headers=headers, timeout=10)
                self.send_response(answer.status_code)
                self.send_header("Content-Type", answer.headers["content-type"])
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def gateway(service: Service, client: TunerClient) -> Iterator[Gateway]:
    proxy = Gateway(service.url)
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.mark.parametrize("failure", ["502", "hang"])
def test_a_gateway_without_its_service_or_a_hung_one_counts_as_unreachable(
    service: Service, gateway: Gateway, tmp_path: Path, failure: str
) -> None:
    with TunerClient(gateway.url, token=service.token, cache_dir=tmp_path, **QUICK) as client:
        fresh = client.recommend(**QUESTION)  # through the gateway while it works
    options = {**QUICK, "timeout": 0.3}  # a hung gateway is given up on quickly
    with TunerClient(gateway.url, token=service.token, cache_dir=tmp_path, **options) as client:
        gateway.mode = failure
        with pytest.raises(ServiceUnavailableError):
            client.list_profiles()  # not a recommendation: nothing to fall back on
        with pytest.warns(TunerOfflineWarning, match="offline cache"):
            cached = client.recommend(**QUESTION)
    assert cached.micro_batch_size == fresh.micro_batch_size


def test_a_url_that_is_not_the_service_is_said_to_be_so(
    service: Service, gateway: Gateway, tmp_path: Path
) -> None:
    with TunerClient(gateway.url, token=service.token, cache_dir=tmp_path, **QUICK) as client:
        client.recommend(**QUESTION)
        gateway.mode = "page"
        with pytest.raises(TunerError, match="not JSON: check that the URL is the microbatch"):
            client.recommend(**QUESTION, fallback=(8, 5))


def test_a_cache_that_cannot_be_written_warns_once_and_answers(
    client: TunerClient, service: Service, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with TunerClient(service.url, token=service.token, cache_dir=blocker / "cache") as unwritable:
        with pytest.warns(TunerClientWarning, match="set TUNER_CACHE_DIR") as caught:
            answer = unwritable.recommend(**QUESTION)
        assert len(caught) == 1
        assert answer.micro_batch_size == 8
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            unwritable.recommend(**QUESTION)


def test_a_damaged_cache_file_is_no_answer(service: Service, client: TunerClient) -> None:
    client.recommend(**QUESTION)
    (cached,) = client.cache_dir.iterdir()
    cached.write_text('{"version": 1, "question": ')
    service.stop()
    with pytest.raises(ServiceUnavailableError):
        client.recommend(**QUESTION)


def test_a_database_that_cannot_be_reached_is_an_outage_too(tmp_path: Path) -> None:
    url = f"postgresql://tuner:secret@127.0.0.1:{free_port()}/tuner"
    with TunerClient(url, cache_dir=tmp_path) as client:
        with pytest.warns(TunerOfflineWarning, match="cannot reach the database") as caught:
            answer = client.recommend(**QUESTION, fallback=(8, 5))
        assert "secret" not in str(caught[0].message)
        assert isinstance(answer, OfflineRecommendation)
        with pytest.raises(ServiceUnavailableError, match="cannot reach the database"):
            client.get_profile(1)


def test_oom_reports_that_fail_warn_once_and_never_raise(
    service: Service, client: TunerClient
) -> None:
    answer = client.recommend(**QUESTION)
    with TunerClient(service.url, token=service.reader, cache_dir=client.cache_dir) as reader:
        refused = reader.oom_reporter(answer)
        with pytest.warns(TunerClientWarning, match="could not report the out-of-memory") as got:
            refused(8, 4, "CUDA out of memory")
        assert len(got) == 1
        assert not isinstance(got[0].message, TunerOfflineWarning)
        assert "'write'" in str(got[0].message)  # the service's own reason

    reporter = client.oom_reporter(answer)
    service.stop()
    with pytest.warns(TunerOfflineWarning, match="training goes on at 4") as got:
        reporter(8, 4, "CUDA out of memory")
    assert len(got) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reporter(4, 2, "CUDA out of memory")
    assert (reporter.failures, reporter.reported) == (2, [])
