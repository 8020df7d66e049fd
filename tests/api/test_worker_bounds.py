"""Real ``tuner worker`` processes against the real service, with jobs that try to exhaust
the worker's host: settings above the owner's ceilings, path options naming files the
owner never allowed (and errors that would tell whether they exist), and a worker killed
with SIGKILL in the middle of a profile."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from pathlib import Path

import pytest

from api.db import Database
from tests.api.conftest import make_token
from tests.api.jobs_helpers import api_client, get_job, job_service, queue, wait_for
from tests.api.worker_processes import CPU_KEY, SQLITE_ONLY, Workers, alive, children_of

MiB = 2**20
REPO = Path(__file__).resolve().parents[2]
TINY_GPT2 = REPO / "tests" / "data" / "tiny_gpt2.json"


@SQLITE_ONLY
@pytest.mark.slow
def test_a_job_gets_no_more_than_the_workers_ceilings(
    migrated_url: str, database: Database, workers: Workers
) -> None:
    """A job that asks for more memory, warm-up or micro batches than the worker's owner
    allows fails at once, for good, with the reason; one within them runs, under its own
    (lower) memory limit. On the old worker the 1 TiB job ran with 1 TiB and the warm-up
    job held the worker until its timeout."""
    admin, token = make_token(database, "admin"), make_token(database, "worker")
    with job_service(migrated_url) as server, api_client(server, admin) as api:
        target = "tests.job_workloads:quick"
        asks = {
            "memory_limit_bytes": 2**40,
            "warmup_steps": 2**31 - 1,
            "size_cap": 2**31 - 1,
        }
        # Each over one ceiling only (the default size cap, 4096, is over this worker's 8).
        greedy = {
            name: queue(api, device=CPU_KEY, target=target, settings={"size_cap": 8, name: value})
            for name, value in asks.items()
        }
        within = queue(
            api,
            device=CPU_KEY,
            target=target,
            settings={"memory_limit_bytes": 32 * MiB, "size_cap": 8, "warmup_steps": 3},
        )["id"]
        worker = workers.start(
            server.url,
            token,
            "--exit-when-idle",
            *("--max-warmup-steps", "3", "--max-size-cap", "8", "--job-timeout", "60"),
            name="bounded",
        )
        assert worker.wait(timeout=120) == 0, workers.log("bounded")
        refused = {name: get_job(api, job["id"]) for name, job in greedy.items()}
        ran = get_job(api, within)
        stored = api.get(f"/profiles/{ran['profile_id']}").json() if ran["profile_id"] else {}

    says = {
        "memory_limit_bytes": "memory_limit_bytes 1 TiB is above the 64 MiB this worker "
        "allows (its --memory-limit)",
        "warmup_steps": "warmup_steps 2147483647 is above the 3 this worker allows "
        "(its --max-warmup-steps)",
        "size_cap": "size_cap 2147483647 is above the 8 this worker allows (its --max-size-cap)",
    }
    for name, job in refused.items():
        assert (job["status"], job["attempts"]) == ("failed", 1), job
        assert job["error"] == (
            f"attempt 1 of 3 (not retried): worker 'bounded' refuses the job: {says[name]}; "
            "queue it within that, or ask the worker's owner to raise it"
        )
    assert ran["status"] == "succeeded", ran["error"]
    assert stored["device"]["capacity_bytes"] == 32 * MiB
    assert stored["size_cap"] == 8


def gpt2_config(directory: Path) -> Path:
    directory.mkdir(exist_ok=True)
    return Path(shutil.copy(TINY_GPT2, directory / "config.json"))


@SQLITE_ONLY
@pytest.mark.slow
def test_path_options_read_only_small_regular_files_the_owner_allowed(
    migrated_url: str, database: Database, workers: Workers, tmp_path: Path
) -> None:
    """``-o config=PATH`` on ``tuner.hf``: /dev/zero, a FIFO, a symlink or ``..`` out of
    the allowed directory and a file over the size are refused without reading them, and a
    path outside says the same whether it exists or not. A config in the directory loads."""
    pytest.importorskip("transformers")
    allowed = tmp_path / "configs"
    gpt2_config(allowed)
    outside = gpt2_config(tmp_path / "elsewhere")
    os.mkfifo(allowed / "fifo.json")
    (allowed / "escape.json").symlink_to(outside)
    (allowed / "zero.json").symlink_to("/dev/zero")
    (allowed / "big.json").write_text(" " * (64 * 1024 + 1))
    admin, token = make_token(database, "admin"), make_token(database, "worker")
    reader = make_token(database, "read", name="curious")
    paths = {
        "zero": "/dev/zero",
        "exists": str(outside),
        "missing": str(tmp_path / "elsewhere" / "no-such.json"),
        "shadow": "/etc/shadow",
        "dotdot": f"{allowed}/../elsewhere/config.json",
        "escape": str(allowed / "escape.json"),
        "zero_link": str(allowed / "zero.json"),
        "fifo": str(allowed / "fifo.json"),
        "big": str(allowed / "big.json"),
        "good": str(allowed),  # a folder holding config.json, as tuner.hf takes it
    }
    with (
        job_service(migrated_url, max_attempts=1) as server,
        api_client(server, admin) as api,
        api_client(server, reader) as read,
    ):
        jobs = {
            name: queue(
                api,
                device=CPU_KEY,
                target="tuner.hf:causal_lm",
                options={"config": path, "seq_len": 8},
                settings={"size_cap": 2},
            )["id"]
            for name, path in paths.items()
        }
        worker = workers.start(
            server.url,
            token,
            "--exit-when-idle",
            *("--allow-path", str(allowed), "--max-file-bytes", "64KiB"),
            name="files",
            allow="tuner.hf",
        )
        assert worker.wait(timeout=300) == 0, workers.log("files")
        done = {name: get_job(read, job_id) for name, job_id in jobs.items()}

    assert done["good"]["status"] == "succeeded", done["good"]["error"]

    def error(name: str) -> str:
        job = done[name]
        assert job["status"] == "failed", job
        # The one line that says why, without the path (the reader already knows it).
        lines = [line for line in job["error"].splitlines() if "config=" in line]
        assert len(lines) == 1, job["error"]
        return lines[-1].replace(repr(paths[name]), "PATH")

    refused = (
        "option config=PATH is not a file this worker may read: it reads only "
        "regular files under the directories its owner allows (tuner worker --allow-path DIR)"
    )
    for name in ("zero", "exists", "missing", "shadow", "dotdot", "escape", "zero_link"):
        assert error(name).endswith(refused), (name, done[name]["error"])
    assert error("fifo").endswith("option config=PATH is not a regular file")
    assert error("big").endswith(
        "option config=PATH is larger than the 64 KiB this worker reads (its --max-file-bytes)"
    )


@SQLITE_ONLY
@pytest.mark.slow
def test_a_worker_killed_with_sigkill_takes_its_profile_with_it(
    migrated_url: str, database: Database, workers: Workers
) -> None:
    """SIGKILL to the worker alone (not its process group): its profile must not live on
    re-parented to PID 1, holding the device while the job reruns elsewhere."""
    admin, token = make_token(database, "admin"), make_token(database, "worker")
    with job_service(migrated_url) as server, api_client(server, admin) as api:
        job = queue(api, device=CPU_KEY, target="tests.job_workloads:hang")
        worker = workers.start(server.url, token, name="killed")
        wait_for("the worker to claim the job", lambda: get_job(api, job["id"])["worker_id"])
        profiling = wait_for("its profile subprocess", lambda: children_of(worker.pid))
        os.kill(worker.pid, signal.SIGKILL)
        assert worker.wait(timeout=10) == -signal.SIGKILL
        try:
            wait_for(
                "the profile to die with its worker",
                lambda: not any(map(alive, profiling)),
                timeout=10,
            )
        finally:
            # An orphan still leads no group of its own: end it here, not at the fixture
            # (which ends the groups of live workers only).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGKILL)
