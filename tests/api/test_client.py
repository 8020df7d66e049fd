"""TunerClient against the real service: configured from arguments or TUNER_URL and
TUNER_TOKEN, answers as typed schemas, errors as the exception type the service raised."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from api.db import Database
from tests.api.builders import at, profile_with_speeds
from tests.api.conftest import make_token
from tests.api.documents import sample_profile
from tests.services import ServerThread
from tuner.client import TunerClient
from tuner.core.errors import (
    AuthenticationError,
    BadInputError,
    NotFoundError,
    NothingFitsError,
    PermissionDeniedError,
    ServiceUnavailableError,
)
from tuner.core.results import Profile


@pytest.fixture
def client(service: ServerThread, admin_token: str) -> Iterator[TunerClient]:
    with TunerClient(service.url, token=admin_token) as client:
        yield client


def test_upload_then_get_list_and_recommend(client: TunerClient) -> None:
    profile = profile_with_speeds({1: 10.0, 8: 80.0, 12: 90.0}, max_micro_batch_size=12)
    stored = client.upload_profile(profile)
    assert stored.id >= 1
    assert isinstance(stored, Profile)
    own = {"id", "workload_id", "device_id"}
    assert stored.model_dump(exclude=own) == profile.model_dump()
    again = client.upload_profile(profile)  # idempotent: safe to retry
    assert again.id == stored.id

    fetched = client.get_profile(stored.id)
    assert fetched == stored

    page = client.list_profiles(workload="gpt-test", device="cpu-test")
    assert [row.id for row in page.data] == [stored.id]
    assert page.count == 1
    assert page.next_page_token is None

    answer = client.recommend(
        workload="gpt-test", device="cpu-test", global_batch_size=40, policy="max"
    )
    assert (answer.micro_batch_size, answer.flat_split()) == (12, [12, 12, 12, 4])
    assert answer.describe() == "3×12 + 4 = 40 samples a step = global batch 40"
    assert (answer.equal.micro_batch_size, answer.equal.grad_accum) == (10, 4)

    report = client.report_oom(
        workload="gpt-test", device="cpu-test", micro_batch_size=12, message="OOM"
    )
    assert report.micro_batch_size == 12
    lowered = client.recommend(workload="gpt-test", device="cpu-test", global_batch_size=40)
    # Below the OOM, M* = 11: 40 samples in 4 balanced micro batches of 10.
    assert (lowered.max_micro_batch_size, lowered.flat_split(), lowered.oom_limit) == (
        11,
        [10] * 4,
        12,
    )


def test_pages_and_time_filters(client: TunerClient) -> None:
    for minutes in range(5):
        client.upload_profile(sample_profile(created_at=at(minutes)))
    seen: list[int] = []
    token = None
    while True:
        page = client.list_profiles(limit=2, page_token=token)
        seen += [row.id for row in page.data]
        token = page.next_page_token
        if token is None:
            break
    assert len(seen) == len(set(seen)) == 5
    middle = client.list_profiles(created_after=at(0.5), created_before=at(3.5))
    assert [row.created_at for row in middle.data] == [at(3), at(2), at(1)]


def test_configured_from_the_environment(
    service: ServerThread, admin_token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNER_URL", service.url + "/")
    monkeypatch.setenv("TUNER_TOKEN", admin_token)
    with TunerClient() as client:
        assert client.url == service.url
        assert client.list_profiles().count == 0


def test_no_url_anywhere_says_how_to_give_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUNER_URL", raising=False)
    with pytest.raises(BadInputError, match="set TUNER_URL"):
        TunerClient()


def test_errors_come_back_as_the_type_the_service_raised(
    service: ServerThread, client: TunerClient, database: Database
) -> None:
    with pytest.raises(NotFoundError, match="no profile with id 999"):
        client.get_profile(999)
    with pytest.raises(NotFoundError, match="no workload has the key or name 'nope'"):
        client.recommend(workload="nope", device="cpu-test", global_batch_size=8)
    with pytest.raises(BadInputError, match="not divisible by world size 3"):
        client.recommend(workload="w", device="d", global_batch_size=8, world_size=3)
    client.upload_profile(sample_profile(max_micro_batch_size=0))
    with pytest.raises(NothingFitsError):
        client.recommend(workload="gpt-test", device="cpu-test", global_batch_size=8)
    with pytest.raises(AuthenticationError), TunerClient(service.url, token="mbt_x") as forged:
        forged.list_profiles()
    reader = TunerClient(service.url, token=make_token(database, "read"))
    with pytest.raises(PermissionDeniedError, match="'write or worker'"), reader:
        reader.upload_profile(sample_profile(created_at=datetime.now(UTC)))


def test_an_unreachable_service_is_unavailable_after_retries() -> None:
    from tests.services import free_port

    with (
        pytest.raises(ServiceUnavailableError, match="cannot reach the service"),
        TunerClient(f"http://127.0.0.1:{free_port()}", retries=1, timeout=1) as client,
    ):
        client.list_profiles()


def test_the_client_imports_without_torch_fastapi_or_sqlalchemy() -> None:
    code = (
        "import sys, tuner.client; "
        "heavy = {'torch', 'fastapi', 'sqlalchemy'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
