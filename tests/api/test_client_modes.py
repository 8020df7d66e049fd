"""TunerClient over both stores it can be given: the real service (uvicorn on loopback) and
the same database used in this process (``sqlite:///…``, ``postgresql://…``), on SQLite
and PostgreSQL. Both give the same schemas, and the same errors with the same messages."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from api import migrate
from api.db import Database
from api.embedded import EmbeddedStore
from api.security import Principal
from api.store import jobs
from tests.api.builders import profile_with_speeds
from tests.api.documents import sample_profile
from tests.api.jobs_helpers import DEVICE_KEY, DEVICE_NAME, TARGET
from tests.helpers import run_python
from tests.services import ServerThread
from tuner.client import TunerClient
from tuner.client.store import DATABASE_SCHEMES, _database_store
from tuner.core.errors import BadInputError, NotFoundError, NothingFitsError, TunerError
from tuner.core.wire.devices import DeviceInfoCreate
from tuner.core.wire.jobs import JobPublic
from tuner.core.wire.recommendation import RecommendationPublic
from tuner.core.wire.workers import WorkerCreate

# The store is the subject: SQLite and PostgreSQL.
pytestmark = pytest.mark.both_stores

MODES = ["http", "embedded"]


def open_client(
    mode: str, url: str, request: pytest.FixtureRequest, cache_dir: Path
) -> TunerClient:
    if mode == "http":
        service: ServerThread = request.getfixturevalue("service")
        token: str = request.getfixturevalue("admin_token")
        return TunerClient(service.url, token=token, cache_dir=cache_dir)
    return TunerClient(url, cache_dir=cache_dir)


@pytest.fixture(params=MODES)
def client(
    request: pytest.FixtureRequest, migrated_url: str, tmp_path: Path
) -> Iterator[TunerClient]:
    """A client of the service, or of its database without a server: same database kinds."""
    with open_client(request.param, migrated_url, request, tmp_path / "cache") as client:
        yield client


@pytest.fixture
def both(
    request: pytest.FixtureRequest, migrated_url: str, tmp_path: Path
) -> Iterator[dict[str, TunerClient]]:
    """One client of each mode over the same database."""
    clients = {mode: open_client(mode, migrated_url, request, tmp_path / mode) for mode in MODES}
    yield clients
    for client in clients.values():
        client.close()


@pytest.mark.slow
def test_upload_get_list_recommend_and_report(client: TunerClient) -> None:
    profile = profile_with_speeds({1: 10.0, 8: 80.0, 12: 90.0}, max_micro_batch_size=12)
    stored = client.upload_profile(profile)
    assert stored.model_dump(exclude={"id", "workload_id", "device_id"}) == profile.model_dump()
    assert client.upload_profile(profile).id == stored.id  # the same profile is recognised
    assert client.get_profile(stored.id) == stored
    page = client.list_profiles(workload="gpt-test", device="cpu-test", limit=1)
    assert ([row.id for row in page.data], page.count) == ([stored.id], 1)

    answer = client.recommend(workload="gpt-test", device="cpu-test", global_batch_size=40)
    assert type(answer) is RecommendationPublic
    assert (answer.micro_batch_size, answer.flat_split(), answer.basis) == (
        10,
        [10, 10, 10, 10],
        "measured",
    )
    assert answer.profile_id == stored.id

    report = client.report_oom(
        workload=answer.workload_key, device=answer.device_key, micro_batch_size=12, message="OOM"
    )
    assert (report.micro_batch_size, report.message) == (12, "OOM")
    lowered = client.recommend(workload="gpt-test", device="cpu-test", global_batch_size=40)
    assert (lowered.max_micro_batch_size, lowered.oom_limit) == (11, 12)


def test_errors_are_the_same_type_with_the_same_message_in_both_modes(
    both: dict[str, TunerClient],
) -> None:
    both["http"].upload_profile(sample_profile(max_micro_batch_size=0))
    calls = {
        "no such profile": lambda c: c.get_profile(999),
        "profile id out of range": lambda c: c.get_profile(0),
        "no such workload": lambda c: c.recommend(
            workload="nope", device="cpu-test", global_batch_size=8
        ),
        "batch not divisible": lambda c: c.recommend(
            workload="gpt-test", device="cpu-test", global_batch_size=8, world_size=3
        ),
        "unknown policy": lambda c: c.recommend(
            workload="gpt-test", device="cpu-test", global_batch_size=8, policy="fastest"
        ),
        "nothing fits": lambda c: c.recommend(
            workload="gpt-test", device="cpu-test", global_batch_size=8
        ),
        "page too long": lambda c: c.list_profiles(limit=501),
        "bad page token": lambda c: c.list_profiles(page_token="nonsense"),
        "OOM report at size 0": lambda c: c.report_oom(
            workload="gpt-test", device="cpu-test", micro_batch_size=0
        ),
        "job with a bad target": lambda c: c.queue_job("not a target", device="cpu-test"),
        "no such job": lambda c: c.get_job(12345),
    }
    expected = {
        "no such profile": NotFoundError,
        "profile id out of range": BadInputError,
        "no such workload": NotFoundError,
        "batch not divisible": BadInputError,
        "unknown policy": BadInputError,
        "nothing fits": NothingFitsError,
        "page too long": BadInputError,
        "bad page token": BadInputError,
        "OOM report at size 0": BadInputError,
        "job with a bad target": BadInputError,
        "no such job": NotFoundError,
    }
    for what, call in calls.items():
        raised: dict[str, TunerError] = {}
        for mode, client in both.items():
            with pytest.raises(TunerError) as caught:
                call(client)
            raised[mode] = caught.value
        http, embedded = raised["http"], raised["embedded"]
        assert type(http) is type(embedded) is expected[what], what
        assert http.message == embedded.message, what


def test_what_one_mode_writes_the_other_reads(both: dict[str, TunerClient]) -> None:
    stored = both["embedded"].upload_profile(sample_profile())
    assert both["http"].get_profile(stored.id) == stored
    both["http"].report_oom(workload="gpt-test", device="cpu-test", micro_batch_size=5)
    answer = both["embedded"].recommend(workload="gpt-test", device="cpu-test", global_batch_size=8)
    assert (answer.micro_batch_size, answer.oom_limit) == (4, 5)


def finish_job(database: Database, job_id: int) -> None:
    """What a worker does, through the store: register, claim the job, store its profile."""
    profile = sample_profile()  # of TARGET on DEVICE_KEY
    caller = Principal(None, "in-test worker", frozenset({"worker", "read"}))
    with database.session(write=True) as session:
        worker, _created = jobs.register_worker(
            session,
            WorkerCreate(
                name="in-test",
                device_key=DEVICE_KEY,
                device=DeviceInfoCreate.model_validate(profile.device.model_dump()),
            ),
            caller,
        )
        claimed = jobs.claim_job(session, worker.id, caller, lease_seconds=60)
        assert claimed is not None
        job, lease = claimed
        assert job.id == job_id
        jobs.complete_job(session, job.id, lease.lease_id, caller, profile)


@pytest.mark.slow
def test_queue_a_job_and_wait_for_it(client: TunerClient, database: Database) -> None:
    job = client.queue_job(
        TARGET,
        device=DEVICE_NAME,
        options={"layers": 2},
        memory_limit_bytes="2MiB",
        headroom=0.1,
    )
    assert isinstance(job, JobPublic)
    assert (job.status, job.target, job.options, job.device) == (
        "queued",
        TARGET,
        {"layers": 2},
        DEVICE_NAME,
    )
    assert (job.settings.memory_limit_bytes, job.settings.headroom) == (2 * 2**20, 0.1)
    assert job.settings.strategy == "model"  # left out: the worker's default
    assert client.get_job(job.id) == job
    with pytest.raises(TimeoutError, match=f"job {job.id} is still queued after 0.2 s"):
        client.wait_for_job(job.id, timeout=0.2, poll=0.05)

    finisher = threading.Timer(0.3, finish_job, args=(database, job.id))
    finisher.start()
    try:
        done = client.wait_for_job(job.id, timeout=30, poll=0.05)
    finally:
        finisher.join()
    assert done.status == "succeeded"
    assert done.profile_id is not None
    assert client.get_profile(done.profile_id).workload.target == TARGET


def test_an_sqlite_file_is_created_and_migrated_on_first_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "new" / "tuner.db"
    monkeypatch.setenv("TUNER_URL", f"sqlite:///{path}")
    with TunerClient(cache_dir=tmp_path / "cache") as client:
        assert client.url == f"sqlite:///{path}"
        assert not path.exists()  # nothing happens until the first call
        assert client.list_profiles().count == 0
    assert migrate.current_revision(f"sqlite:///{path}") == migrate.head_revision()


def test_postgresql_must_be_migrated_by_its_owner(postgres_url: str, tmp_path: Path) -> None:
    with (
        TunerClient(postgres_url, cache_dir=tmp_path) as client,
        pytest.raises(BadInputError, match="run `tuner db upgrade`"),
    ):
        client.list_profiles()


def test_a_url_of_no_known_kind_says_what_to_give(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match=r"give the service \(http://host:8000"):
        TunerClient("ftp://example.com/tuner", cache_dir=tmp_path)
    with pytest.raises(BadInputError, match="cannot use 'localhost:8000' as TUNER_URL"):
        TunerClient("localhost:8000", cache_dir=tmp_path)


def test_embedded_mode_without_the_server_extra_says_how_to_install_it(tmp_path: Path) -> None:
    # Blocking the import is exactly what an install without the extra looks like.
    child = run_python(
        "import sys\n"
        "sys.modules['sqlalchemy'] = None\n"
        "from tuner.client import TunerClient\n"
        "from tuner.core.errors import BadInputError\n"
        "try:\n"
        f"    TunerClient('sqlite:///{tmp_path}/t.db')\n"
        "except BadInputError as exc:\n"
        "    print(exc.message)\n"
    )
    assert child.returncode == 0, child.stderr
    assert "pip install -e '.[server]'" in child.stdout
    assert "sqlalchemy" in child.stdout


def test_the_database_stores_are_the_services_found_by_their_entry_points() -> None:
    # The client names no module of the service: the service declares its store.
    assert {scheme: _database_store(scheme) for scheme in DATABASE_SCHEMES} == dict.fromkeys(
        DATABASE_SCHEMES, EmbeddedStore
    )


@pytest.mark.slow
def test_the_client_stays_light_until_a_database_url_is_used(tmp_path: Path) -> None:
    child = run_python(
        "import sys\n"
        "from tuner.client import TunerClient\n"
        "heavy = lambda: {'torch', 'fastapi', 'sqlalchemy'} & set(sys.modules)\n"
        "with TunerClient('http://127.0.0.1:9'):\n"
        "    assert not heavy(), heavy()\n"
        f"with TunerClient('sqlite:///{tmp_path}/t.db') as client:\n"
        "    assert client.list_profiles().count == 0\n"
        "    assert 'sqlalchemy' in sys.modules and 'torch' not in sys.modules\n"
        "print('ok')\n"
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "ok"
