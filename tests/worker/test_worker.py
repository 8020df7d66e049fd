"""The worker's parts that need no service: the command it runs for a job, how it judges
a finished run, the device it registers, its settings and its command line."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tests.api.documents import sample_profile
from tests.helpers import scaled
from tuner.core.errors import BadInputError
from tuner.core.option_files import FilePolicy
from tuner.core.plan import recommend
from tuner.core.reports import ProfileReport
from tuner.core.wire.jobs import JobSettings
from tuner.engine.backends import make_backend
from tuner.engine.fingerprint import device_key
from tuner.worker.allow import AllowList
from tuner.worker.ceilings import Ceilings
from tuner.worker.loop import DeviceIdentity, Worker, WorkerSettings, describe_device
from tuner.worker.profile_run import (
    STDERR_TAIL_LINES,
    Run,
    outcome_of,
    profile_command,
    profile_from_output,
    run_profile,
    tail_of,
)

MiB = 2**20


def command_for(**fields: Any) -> list[str]:
    defaults = {"options": {}, "settings": {}, "device": "cpu", "memory_limit_bytes": None}
    arguments: dict[str, Any] = defaults | fields
    return profile_command("pkg.mod:factory", **arguments)


def printed(profile_json: str, *noise: str) -> str:
    return "\n".join([*noise, profile_json]) + "\n"


def test_the_command_carries_the_jobs_settings_and_options() -> None:
    command = command_for(
        settings={
            "memory_limit_bytes": None,
            "headroom": 0.1,
            "strategy": "bisect",
            "size_cap": 64,
            "warmup_steps": 3,
        },
        options={"precision": "bf16", "layers": 4, "tied": True, "note": None},
        device="cuda:1",
    )
    assert command[:6] == [
        sys.executable,
        "-m",
        "tuner.cli",
        "profile",
        "pkg.mod:factory",
        "--json",
    ]
    flags = command[6:]
    assert flags[:2] == ["--device", "cuda:1"]
    assert "--memory-limit" not in flags
    assert flags[2:10] == [
        *("--headroom", "0.1"),
        *("--strategy", "bisect"),
        *("--max", "64"),
        *("--warmup-steps", "3"),
    ]
    # Option values travel as JSON, which `tuner profile` reads back as the same values.
    assert flags[10:] == [
        *("-o", 'precision="bf16"'),
        *("-o", "layers=4"),
        *("-o", "tied=true"),
        *("-o", "note=null"),
    ]


def test_a_jobs_memory_limit_overrides_the_workers() -> None:
    own = command_for(memory_limit_bytes=64 * MiB)
    assert own[own.index("--memory-limit") + 1] == str(64 * MiB)
    given = command_for(settings={"memory_limit_bytes": 8 * MiB}, memory_limit_bytes=64 * MiB)
    assert given[given.index("--memory-limit") + 1] == str(8 * MiB)


def test_the_command_reads_files_only_where_the_worker_allows(tmp_path: Path) -> None:
    flags = command_for(files=FilePolicy.of([str(tmp_path)], max_bytes=MiB))[6:]
    assert flags[:6] == [
        *("--device", "cpu"),
        *("--allow-path", str(tmp_path)),
        *("--max-file-bytes", str(MiB)),
    ]
    # No directory allowed: the restriction still applies, and reads nothing.
    assert command_for(files=FilePolicy(()))[8:10] == ["--max-file-bytes", str(4 * MiB)]


def test_a_job_over_a_ceiling_is_refused_in_one_line() -> None:
    ceilings = Ceilings(memory_limit_bytes=64 * MiB, warmup_steps=3, size_cap=8)
    assert (
        ceilings.refusal(JobSettings(size_cap=8, memory_limit_bytes=64 * MiB), worker="w") is None
    )
    both = ceilings.refusal(JobSettings(size_cap=9, warmup_steps=4), worker="w")
    assert both == (
        "worker 'w' refuses the job: warmup_steps 4 is above the 3 this worker allows (its "
        "--max-warmup-steps), and size_cap 9 is above the 8 this worker allows (its "
        "--max-size-cap); queue it within them, or ask the worker's owner to raise them"
    )


def test_the_printed_profile_is_read_back_exactly() -> None:
    profile = sample_profile()
    plan = recommend(max_micro_batch_size=8, probes=profile.probes, global_batch_size=32)
    # What `tuner profile --global-batch-size 32 --json` prints: the plan and advice beside.
    document = ProfileReport.of(profile, recommendation=plan, advice=[]).document()
    assert "peak_bytes" in document["probes"][0]
    stdout = printed(json.dumps(document), "the workload printed this", "{not json either")
    assert profile_from_output(stdout) == profile


@pytest.mark.parametrize("returncode", [0, 3])
def test_exit_0_and_3_carry_a_profile(returncode: int) -> None:
    profile = sample_profile(max_micro_batch_size=0 if returncode == 3 else 8)
    outcome = outcome_of(Run(returncode, printed(profile.model_dump_json()), "probe 1"), timeout=60)
    assert outcome.profile == profile
    assert outcome.reason is None


@pytest.mark.parametrize(
    ("returncode", "retryable", "says"),
    [
        (1, False, "exited 1: the workload raised an error that is not an out-of-memory"),
        (2, False, "exited 2: the job's target, options or settings are unusable here"),
        (-signal.SIGKILL, True, "killed by SIGKILL"),
        (-signal.SIGSEGV, True, "killed by SIGSEGV"),
        (70, True, "exited 70, a status it never uses"),
        (None, True, "did not finish within 60 s"),
        (0, False, "exited 0 but tuner profile printed no JSON profile"),
    ],
)
def test_failures_say_what_happened_and_whether_to_retry(
    returncode: int | None, retryable: bool, says: str
) -> None:
    outcome = outcome_of(Run(returncode, "", "Traceback...\nValueError: bad shape"), timeout=60)
    assert outcome.profile is None
    assert outcome.retryable is retryable
    assert outcome.reason is not None
    assert says in outcome.reason
    assert outcome.reason.endswith("\nTraceback...\nValueError: bad shape")


def test_the_stderr_tail_is_bounded() -> None:
    stream = io.BytesIO("".join(f"line {i}\n" for i in range(10_000)).encode())
    tail = tail_of(stream)
    assert tail.splitlines() == [f"line {i}" for i in range(10_000 - STDERR_TAIL_LINES, 10_000)]
    assert tail_of(io.BytesIO(b"")) == ""


@pytest.mark.slow
def test_the_device_is_described_in_a_subprocess() -> None:
    identity = describe_device("cpu", 64 * MiB)
    backend = make_backend("cpu", memory_limit_bytes=64 * MiB)
    assert identity.device == "cpu"
    assert identity.key == device_key(backend)
    assert identity.info.capacity_bytes == 64 * MiB
    assert identity.info.name == backend.describe().name
    assert identity.ranks == (os.cpu_count() or 1)  # a CPU rank is a process, one per core


def test_a_jobs_world_size_and_parallel_mode_reach_the_command() -> None:
    flags = command_for(settings={"world_size": 4, "parallel": "ddp"})[6:]
    assert flags[-4:] == ["--world-size", "4", "--parallel", "ddp"]
    assert "--parallel" not in command_for(settings={"world_size": 1, "parallel": None})


@pytest.mark.slow
@pytest.mark.parametrize(
    ("device", "limit", "says"),
    [("cpu", None, "--memory-limit"), ("tpu", 64 * MiB, "unknown device 'tpu'")],
)
def test_an_unusable_device_is_refused(device: str, limit: int | None, says: str) -> None:
    with pytest.raises(BadInputError, match=f"cannot use device {device}: .*{says}"):
        describe_device(device, limit)


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_URL", "http://tuner:8000")
    monkeypatch.setenv("TUNER_MEMORY_LIMIT", "2GiB")
    monkeypatch.setenv("TUNER_POLL_INTERVAL", "0.5")
    monkeypatch.setenv("TUNER_DATABASE_URL", "sqlite:///elsewhere.db")  # the service's
    monkeypatch.setenv("TUNER_WORKER_ALLOW_PATH", f"/srv/a,b{os.pathsep}/srv/c")
    monkeypatch.setenv("TUNER_MAX_FILE_BYTES", "1MiB")
    monkeypatch.setenv("TUNER_MAX_WARMUP_STEPS", "5")
    settings = WorkerSettings()
    assert settings.url == "http://tuner:8000"
    assert settings.memory_limit == 2 * 2**30
    assert settings.poll_interval == 0.5
    assert settings.allow_path == ["/srv/a,b", "/srv/c"]
    assert (settings.max_file_bytes, settings.max_warmup_steps) == (MiB, 5)
    assert settings.max_size_cap == 4096
    monkeypatch.setenv("TUNER_POLL_INTERVAL", "0")
    with pytest.raises(ValidationError, match="poll_interval"):
        WorkerSettings()


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", "worker", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )


@pytest.mark.slow
def test_the_command_line_refuses_bad_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUNER_URL", raising=False)
    missing = run_cli("--device", "cpu", "--memory-limit", "64MiB")
    assert missing.returncode == 2
    assert "give the service's address with --url or TUNER_URL" in missing.stderr
    zero = run_cli("--url", "http://127.0.0.1:9", "--poll-interval", "0")
    assert zero.returncode == 2
    assert "must be a positive number of seconds" in zero.stderr
    no_limit = run_cli("--url", "http://127.0.0.1:9", "--device", "cpu", "--allow", "examples")
    assert no_limit.returncode == 2
    assert "--memory-limit" in no_limit.stderr


@pytest.mark.slow
def test_a_worker_that_allows_nothing_does_not_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """It would fail every job it claimed: better to say so once, at start."""
    monkeypatch.delenv("TUNER_WORKER_ALLOW", raising=False)
    refused = run_cli("--url", "http://127.0.0.1:9", "--device", "cpu", "--memory-limit", "64MiB")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "tuner worker: say which workloads this worker may run: --allow PATTERN (or "
        "TUNER_WORKER_ALLOW), e.g. --allow examples or --allow mypkg.models; a job queued by "
        "any write token runs here as this user"
    ]
    bad = run_cli("--url", "http://127.0.0.1:9", "--allow", "examples;rm")
    assert bad.returncode == 2
    assert "--allow 'examples;rm' is not a module prefix or glob" in bad.stderr


def test_the_allow_list_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_WORKER_ALLOW", "examples, mypkg.*")
    assert AllowList.parse(WorkerSettings().allow).patterns == ("examples", "mypkg.*")
    monkeypatch.setenv("TUNER_WORKER_PASS_ENV", "HF_TOKEN,DATASETS")
    assert WorkerSettings().pass_env == ["HF_TOKEN", "DATASETS"]
    monkeypatch.delenv("TUNER_WORKER_ALLOW")
    assert WorkerSettings().allow == []


def test_an_unreachable_service_is_waited_for_until_stopped() -> None:
    backend = make_backend("cpu", memory_limit_bytes=64 * MiB)
    messages: list[str] = []
    worker = Worker(
        url="http://127.0.0.1:9",  # discard: nothing answers
        token=None,
        identity=DeviceIdentity("cpu", device_key(backend), backend.describe()),
        name="patient",
        allow=AllowList(("examples",)),
        poll_interval=0.1,
        log=messages.append,
    )
    stopper = threading.Timer(1.0, worker.stop)
    stopper.start()
    try:
        assert worker.run() == 0
    finally:
        stopper.cancel()
        worker.close()
    assert worker.worker_id is None
    assert any("cannot register yet, retrying" in m for m in messages)


@pytest.mark.slow
def test_a_run_ends_at_its_timeout_or_when_cancelled() -> None:
    sleeper = [
        sys.executable,
        "-c",
        "import sys, time; print('started', flush=True); "
        "sys.stderr.write('waiting\\n'); time.sleep(60)",
    ]
    started = time.monotonic()
    # Long enough for the child to start and print on a busy machine; it then sleeps on.
    timed_out = run_profile(sleeper, timeout=scaled(3.0), cancelled=lambda: False)
    assert timed_out == Run(None, "started\n", "waiting", cancelled=False)
    asked = threading.Event()
    threading.Timer(0.5, asked.set).start()
    cancelled = run_profile(sleeper, timeout=60, cancelled=asked.is_set)
    assert cancelled.returncode is None
    assert cancelled.cancelled
    assert time.monotonic() - started < scaled(3.0) + scaled(10)
    finished = run_profile([sys.executable, "-c", "exit(3)"], timeout=60, cancelled=lambda: False)
    assert finished == Run(3, "", "")
