"""Real ``tuner worker`` processes against the real service: a worker killed mid-job, a
workload that crashes, raises or hangs, a stop, a lease lost while profiling, and jobs
queued by an attacker with a ``write`` token."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select, update

from api import models
from api.db import Database
from api.store.profiles import to_result
from tests.api.conftest import make_token
from tests.api.jobs_helpers import api_client, get_job, job_service, queue, wait_for
from tests.api.worker_processes import (
    CPU_KEY,
    MEMORY_LIMIT,
    REPO,
    SQLITE_ONLY,
    Workers,
    alive,
    children_of,
)
from tuner.engine.backends import make_backend
from tuner.worker.allow import AllowList
from tuner.worker.loop import DeviceIdentity, Worker


def profiles_stored(database: Database) -> int:
    with database.session() as session:
        return session.scalar(select(func.count()).select_from(models.Profile)) or 0


def worker_id_named(client: Any, name: str) -> int:
    ids = [w["id"] for w in client.get("/workers").json()["data"] if w["name"] == name]
    assert len(ids) == 1, ids
    worker_id: int = ids[0]
    return worker_id


@pytest.mark.slow
def test_a_worker_killed_mid_job_loses_the_job_to_another(
    migrated_url: str, database: Database, workers: Workers
) -> None:
    lease = 2.0
    admin, token = make_token(database, "admin"), make_token(database, "worker")
    with job_service(migrated_url, lease_seconds=lease) as server, api_client(server, admin) as api:
        job = queue(
            api,
            device=CPU_KEY,
            target="tests.job_workloads:slow",
            options={"delay": 0.3},  # about 8 s of sleeping in loss_fn
            settings={"size_cap": 4},
        )
        first = workers.start(server.url, token, "--once", name="A")
        wait_for(
            "worker A to claim the job", lambda: get_job(api, job["id"])["status"] == "running"
        )
        profiling = wait_for("worker A's profile subprocess", lambda: children_of(first.pid))
        # B is up and polling before A dies, so what follows measures the lease alone.
        second = workers.start(server.url, token, "--once", name="B")
        wait_for("B to register", lambda: "registered as worker" in workers.log("B"))

        before = get_job(api, job["id"])
        assert (before["status"], before["attempts"]) == ("running", 1), "A finished too soon"
        os.killpg(first.pid, signal.SIGKILL)  # the worker and its profile, mid-job
        killed = time.monotonic()
        assert first.wait(timeout=10) == -signal.SIGKILL
        wait_for("A's profile to die with it", lambda: not any(map(alive, profiling)), timeout=10)

        wait_for("B to claim the job again", lambda: get_job(api, job["id"])["attempts"] == 2)
        reclaimed_after = time.monotonic() - killed
        done = wait_for(
            "B to finish the job",
            lambda: (now := get_job(api, job["id"]))["status"] in ("succeeded", "failed") and now,
            timeout=120,
        )
        recovered_after = time.monotonic() - killed
        assert second.wait(timeout=30) == 0, workers.log("B")
        b_id = worker_id_named(api, "B")

    print(f"\nlease {lease:g} s: reclaimed {reclaimed_after:.1f} s, done {recovered_after:.1f} s")
    assert done["status"] == "succeeded", done["error"]
    assert done["attempts"] == 2
    assert done["worker_id"] == b_id
    assert done["error"] is None  # cleared: the job succeeded in the end
    # A's last heartbeat was at most a third of a lease before the kill; B claims within a
    # poll interval of the expiry (with slack for a busy machine).
    assert lease * 2 / 3 - 0.1 <= reclaimed_after <= lease + 3
    assert profiles_stored(database) == 1
    with database.session() as session:
        stored = to_result(session.get_one(models.Profile, done["profile_id"]))
    assert stored.workload.target == "tests.job_workloads:slow"
    assert stored.device_key == CPU_KEY
    assert stored.max_micro_batch_size == 4


@SQLITE_ONLY
@pytest.mark.slow
def test_the_worker_outlives_workloads_that_crash_or_raise(
    migrated_url: str, database: Database, workers: Workers
) -> None:
    admin, token = make_token(database, "admin"), make_token(database, "worker")
    with (
        job_service(migrated_url, max_attempts=2) as server,
        api_client(server, admin) as api,
    ):
        jobs = {
            name: queue(
                api, device=CPU_KEY, target=f"tests.job_workloads:{name}", settings={"size_cap": 4}
            )["id"]
            for name in ("exits", "raises", "quick")
        }
        worker = workers.start(server.url, token, "--exit-when-idle", name="survivor")
        assert worker.wait(timeout=180) == 0, workers.log("survivor")
        exits, raises, quick = (get_job(api, jobs[name]) for name in ("exits", "raises", "quick"))

    # A crash is retried (another host might not crash), until the attempts run out.
    assert exits["status"] == "failed"
    assert exits["attempts"] == 2
    assert "attempt 2 of 2, the last" in exits["error"]
    assert "exited 70" in exits["error"]
    # An error in the workload is the workload's: retrying would not help.
    assert raises["status"] == "failed"
    assert raises["attempts"] == 1
    assert "not retried" in raises["error"]
    assert "RuntimeError: deliberate bug" in raises["error"]
    # And the worker went on to the next job.
    assert quick["status"] == "succeeded", quick["error"]
    assert profiles_stored(database) == 1
    assert "stored a profile" in workers.log("survivor")


@SQLITE_ONLY
@pytest.mark.slow
def test_a_hung_profile_is_killed_at_the_job_timeout(
    migrated_url: str, database: Database, workers: Workers
) -> None:
    admin, token = make_token(database, "admin"), make_token(database, "worker")
    with (
        job_service(migrated_url, max_attempts=1) as server,
        api_client(server, admin) as api,
    ):
        job = queue(api, device=CPU_KEY, target="tests.job_workloads:hang")
        worker = workers.start(
            server.url, token, "--exit-when-idle", "--job-timeout", "3", name="patient"
        )
        assert worker.wait(timeout=60) == 0, workers.log("patient")
        failed = get_job(api, job["id"])
    assert failed["status"] == "failed"
    assert "did not finish within 3 s" in failed["error"]
    assert not children_of(worker.pid)


@SQLITE_ONLY
@pytest.mark.slow
def test_sigterm_hands_the_running_job_back(
    migrated_url: str, database: Database, workers: Workers
) -> None:
    admin, token = make_token(database, "admin"), make_token(database, "worker")
    with job_service(migrated_url) as server, api_client(server, admin) as api:
        job = queue(api, device=CPU_KEY, target="tests.job_workloads:hang")
        worker = workers.start(server.url, token, name="stopped")
        wait_for("the worker to claim the job", lambda: get_job(api, job["id"])["worker_id"])
        profiling = wait_for("its profile subprocess", lambda: children_of(worker.pid))
        worker.send_signal(signal.SIGTERM)  # the worker alone, as a supervisor would
        assert worker.wait(timeout=30) == 0, workers.log("stopped")
        back = get_job(api, job["id"])
    assert not any(map(alive, profiling))
    assert back["status"] == "queued"
    assert back["attempts"] == 1
    assert "was stopped while the job ran" in back["error"]
    assert "SIGTERM" in workers.log("stopped")


@SQLITE_ONLY
@pytest.mark.slow
def test_a_lost_lease_stops_the_profile_and_the_worker_moves_on(
    migrated_url: str, database: Database
) -> None:
    admin, token = make_token(database, "admin"), make_token(database, "worker")
    messages: list[str] = []
    with (
        job_service(migrated_url, lease_seconds=3.0) as server,
        api_client(server, admin) as api,
    ):
        job = queue(api, device=CPU_KEY, target="tests.job_workloads:hang")
        backend = make_backend("cpu", memory_limit_bytes=MEMORY_LIMIT)
        worker = Worker(
            url=server.url,
            token=token,
            identity=DeviceIdentity("cpu", CPU_KEY, backend.describe()),
            name="in-process",
            allow=AllowList(("tests.job_workloads",)),
            memory_limit_bytes=MEMORY_LIMIT,
            poll_interval=0.2,
            log=messages.append,
        )
        runner = threading.Thread(target=worker.run, kwargs={"max_jobs": 1})
        runner.start()
        try:
            wait_for("the claim", lambda: get_job(api, job["id"])["status"] == "running")
            # As if the lease had expired and another worker had taken the job.
            with database.session(write=True) as session:
                session.execute(
                    update(models.Job).where(models.Job.id == job["id"]).values(lease_id="0" * 32)
                )
            runner.join(timeout=30)
            assert not runner.is_alive()
        finally:
            worker.stop()
            runner.join()
            worker.close()
    assert any("lost the lease" in m for m in messages), messages
    assert any("dropped" in m for m in messages), messages
    # The worker reported nothing: the job is the new lease holder's.
    with database.session() as session:
        still = session.get_one(models.Job, job["id"])
        assert (still.status, still.lease_id, still.error) == ("running", "0" * 32, None)


def planted(directory: Path, name: str, source: str) -> Path:
    """A module ``name`` in ``directory``, importable by a worker with it on PYTHONPATH."""
    directory.mkdir(exist_ok=True)
    (directory / f"{name}.py").write_text(source)
    return directory


def environment_with(path: Path, **variables: str) -> dict[str, str]:
    """This environment, ``path`` first on PYTHONPATH, and ``variables``."""
    paths = [str(path), str(REPO), os.environ.get("PYTHONPATH")]
    python_path = os.pathsep.join(filter(None, paths))
    return {**os.environ, "PYTHONPATH": python_path, **variables}


@SQLITE_ONLY
@pytest.mark.slow
def test_a_write_token_cannot_make_a_worker_run_code_its_owner_did_not_allow(
    migrated_url: str, database: Database, workers: Workers, tmp_path: Path
) -> None:
    """The attack: jobs that would run a shell command, or import a module whose import
    alone does harm. The worker runs neither, and the host keeps no trace of them."""
    pwned, imported = tmp_path / "pwned", tmp_path / "imported"
    plant = planted(
        tmp_path / "plant",
        "harmful",
        f"import os, pathlib\npathlib.Path({str(imported)!r}).touch()\n"
        "def workload(command):\n    os.system(command)\n",
    )
    admin, worker_token = make_token(database, "admin"), make_token(database, "worker")
    attacker = make_token(database, "write", name="a-training-script")
    with (
        job_service(migrated_url) as server,
        api_client(server, attacker) as evil,
        api_client(server, admin) as api,
    ):
        attacks = [
            queue(evil, device=CPU_KEY, target="os:system", options={"command": f"touch {pwned}"}),
            queue(evil, device=CPU_KEY, target="harmful:workload", options={"command": "true"}),
            # A name that starts like the allowed package is another package.
            queue(evil, device=CPU_KEY, target="tests.job_workloads_x:quick"),
        ]
        allowed = queue(
            api, device=CPU_KEY, target="tests.job_workloads:quick", settings={"size_cap": 4}
        )
        worker = workers.start(
            server.url,
            worker_token,
            "--exit-when-idle",
            name="owned",
            env=environment_with(plant),
        )
        assert worker.wait(timeout=120) == 0, workers.log("owned")
        refused = [get_job(evil, job["id"]) for job in attacks]  # a read is all it takes
        done = get_job(api, allowed["id"])

    assert not pwned.exists()
    assert not imported.exists()  # never imported, by the worker or a subprocess
    for job in refused:
        assert (job["status"], job["attempts"]) == ("failed", 1), job
        assert job["error"] == (
            f"attempt 1 of 3 (not retried): target {job['target']!r} is not allowed on worker "
            "'owned', which runs only tests.job_workloads: its owner may allow it with "
            "`tuner worker --allow PATTERN`"
        )
    # The worker went on to the job its owner allows.
    assert done["status"] == "succeeded", done["error"]


SPY = """
import json, os, pathlib

def workload(record):
    pathlib.Path(record).write_text(json.dumps(dict(os.environ)))
    # Allowed code runs as the worker's user: it can read the worker's own environment.
    worker = pathlib.Path(f"/proc/{os.getppid()}/environ").read_bytes().split(b"\\0")
    token = next(v for v in worker if v.startswith(b"TUNER_TOKEN=")).decode().split("=", 1)[1]
    raise RuntimeError(f"the worker's token is {token}")
"""


@SQLITE_ONLY
@pytest.mark.slow
def test_a_jobs_code_gets_none_of_the_workers_credentials(
    migrated_url: str, database: Database, workers: Workers, tmp_path: Path
) -> None:
    """Even code the owner allowed sees no TUNER_TOKEN (nor any other secret of the
    worker's environment), and the job's error never shows the token to its readers."""
    record = tmp_path / "environment.json"
    plant = planted(tmp_path / "plant", "spy", SPY)
    admin, worker_token = make_token(database, "admin"), make_token(database, "worker")
    secrets = {"TUNER_TOKEN": worker_token, "AWS_SECRET_ACCESS_KEY": "s3cr3t-of-the-host"}
    given = {"DATASETS": "/srv/data"}  # what the owner passes on with --pass-env
    with job_service(migrated_url) as server, api_client(server, admin) as api:
        job = queue(api, device=CPU_KEY, target="spy:workload", options={"record": str(record)})
        worker = workers.start(
            server.url,
            None,  # TUNER_TOKEN, as the README runs it: out of `ps`
            "--exit-when-idle",
            "--pass-env",
            "DATASETS",
            name="spied-on",
            allow="spy",
            env=environment_with(plant, **secrets, **given),
        )
        assert worker.wait(timeout=120) == 0, workers.log("spied-on")
        failed = get_job(api, job["id"])

    seen = json.loads(record.read_text())
    assert not [name for name in seen if name.startswith("TUNER_")]
    assert "AWS_SECRET_ACCESS_KEY" not in seen
    assert worker_token not in json.dumps(seen)
    assert seen["PATH"] == os.environ["PATH"]  # what a workload needs still arrives
    assert str(plant) in seen["PYTHONPATH"]
    assert seen["DATASETS"] == "/srv/data"
    assert failed["status"] == "failed"
    assert "RuntimeError: the worker's token is [redacted]" in failed["error"]
    assert worker_token not in failed["error"]


@pytest.mark.slow
@SQLITE_ONLY
def test_a_worker_that_stops_on_purpose_has_left_and_one_killed_goes_silent(
    migrated_url: str, database: Database, workers: Workers
) -> None:
    """`--exit-when-idle` says it leaves before it exits: the service and the jobs page
    show it gone, not silent. A worker killed with SIGKILL says nothing, and is silent once
    its heartbeats stop (here at once: a lease of 0.2 s makes 0.4 s of quiet silence)."""
    admin, token = make_token(database, "admin"), make_token(database, "worker")
    with (
        job_service(migrated_url, lease_seconds=0.2) as server,
        api_client(server, admin) as api,
    ):
        idle = workers.start(server.url, token, "--exit-when-idle", name="idle")
        assert idle.wait(timeout=120) == 0, workers.log("idle")
        killed = workers.start(server.url, token, name="killed")
        wait_for(
            "the second worker to register",
            lambda: len(api.get("/workers").json()["data"]) == 2,
        )
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
        time.sleep(0.5)
        listed = {w["name"]: w for w in api.get("/workers").json()["data"]}
        assert listed["idle"]["left_at"] is not None
        assert listed["killed"]["left_at"] is None
        page = httpx.get(f"{server.url}/jobs", cookies={"tuner_token": admin}).text
    assert f'data-worker-id="{listed["idle"]["id"]}" data-state="left"' in page
    assert f'data-worker-id="{listed["killed"]["id"]}" data-state="silent"' in page
