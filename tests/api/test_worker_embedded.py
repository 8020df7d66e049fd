"""The worker speaks to the service only through the client's ``Store``: given a database
URL instead of a service, the same loop registers, claims, runs (a real ``tuner profile``
subprocess) and reports through the embedded store, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from api.embedded import EmbeddedStore
from tuner.engine.backends import make_backend
from tuner.engine.fingerprint import device_key
from tuner.worker.allow import AllowList
from tuner.worker.loop import DeviceIdentity, Worker

MEMORY_LIMIT = 64 * 2**20


@pytest.mark.slow
@pytest.mark.both_stores  # the embedded store over each kind of database URL
def test_a_worker_over_a_database_url_profiles_and_refuses_through_the_embedded_store(
    migrated_url: str,
) -> None:
    backend = make_backend("cpu", memory_limit_bytes=MEMORY_LIMIT)
    identity = DeviceIdentity("cpu", device_key(backend), backend.describe())
    messages: list[str] = []
    worker = Worker(
        url=migrated_url,
        token=None,
        identity=identity,
        name="local",
        allow=AllowList(("tests.job_workloads",)),
        memory_limit_bytes=MEMORY_LIMIT,
        poll_interval=0.1,
        job_timeout=120,
        log=messages.append,
    )
    store = EmbeddedStore(migrated_url)
    try:
        assert worker.register() is not None
        quick = store.queue_job(
            {
                "target": "tests.job_workloads:quick",
                "device": identity.key,
                "settings": {"size_cap": 4},
            }
        )
        refused = store.queue_job({"target": "os:system", "device": identity.key})
        # Each job is run to its end and reported before the next claim.
        assert worker.run(max_jobs=2, exit_when_idle=True) == 2
        profiled = store.get_job(quick.id)
        assert profiled.status == "succeeded", (profiled.error, messages)
        assert profiled.worker_id == worker.worker_id
        assert profiled.profile_id is not None
        stored = store.get_profile(profiled.profile_id)
        assert stored.workload.target == "tests.job_workloads:quick"
        assert stored.max_micro_batch_size >= 1
        failed = store.get_job(refused.id)
        assert failed.status == "failed"  # refused for good: this worker never runs it
        assert failed.error is not None
        assert "os:system" in failed.error
    finally:
        worker.close()
        store.close()
