"""What ``tuner recommend`` prints says one thing and can be acted on: a command it
suggests runs as printed (on a CPU device, with the memory limit the device stands for),
an estimate always has a peak, and being offline is explained to a person, not a program."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.api.builders import upload
from tests.api.documents import MiB, sample_profile
from tests.helpers import REPO_ROOT, subprocess_env, tuner_executable
from tests.services import ServerThread, free_port
from tuner.core.parallel import Parallel

# A workload that profiles in seconds under DDP on two CPU ranks.
TINY = "tests.workloads:tiny_ranks"


def tuner(
    *args: str, url: str, token: str, cache: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**subprocess_env(), "TUNER_URL": url, "TUNER_TOKEN": token, "COLUMNS": "300"}
    if cache is not None:
        env |= {"TUNER_CACHE_DIR": str(cache), "TUNER_RETRIES": "0", "TUNER_TIMEOUT": "2"}
    return subprocess.run(
        [str(tuner_executable()), *args],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def suggested_commands(text: str) -> list[list[str]]:
    """Every ``tuner …`` command quoted in backticks in ``text``, as arguments."""
    return [shlex.split(found)[1:] for found in re.findall(r"`(tuner [^`]+)`", text)]


@pytest.mark.slow
def test_the_ddp_caveats_command_runs_as_printed_on_a_cpu_device(
    http: httpx.Client, service: ServerThread, admin_token: str
) -> None:
    one_process = sample_profile(capacity_bytes=3 * MiB, max_micro_batch_size=2)
    one_process = one_process.model_copy(
        update={"workload": one_process.workload.model_copy(update={"target": TINY})}
    )
    upload(http, one_process)
    asked = tuner(
        "recommend", "--workload", "gpt-test", "--device", "cpu-test", "--global-batch-size",
        "8", "--world-size", "2", "--parallel", "ddp", url=service.url, token=admin_token,
    )  # fmt: skip
    assert asked.returncode == 0, asked.stderr
    [command] = suggested_commands(asked.stdout)
    assert command == [
        "profile", TINY, "--device", "cpu", "--memory-limit", str(3 * MiB),
        "--world-size", "2", "--parallel", "ddp", "--upload",
    ]  # fmt: skip
    ran = tuner(*command, url=service.url, token=admin_token)
    assert ran.returncode == 0, ran.stderr
    assert "uploaded as profile 2" in ran.stdout


def test_a_missing_profiles_command_carries_the_cpu_memory_limit(
    http: httpx.Client, service: ServerThread, admin_token: str
) -> None:
    elsewhere = sample_profile(capacity_bytes=3 * MiB, device_key="e" * 24, device_name="other")
    upload(http, elsewhere)
    # Another workload, with no fit to estimate from: only profiling it answers.
    here = sample_profile(workload_key="v" * 24, workload_name="another", capacity_bytes=5 * MiB)
    upload(http, here.model_copy(update={"fit": None}))
    asked = http.get(
        "/api/v1/recommendation",
        params={"workload": "another", "device": "other", "global_batch_size": 8},
    )
    assert asked.status_code == 404, asked.text
    [command] = suggested_commands(asked.json()["error"]["message"])
    assert command[2:6] == ["--device", "cpu", "--memory-limit", str(3 * MiB)]


def test_an_estimate_smaller_than_its_m_star_still_has_a_peak(
    http: httpx.Client, service: ServerThread, admin_token: str
) -> None:
    # Measured under DDP at world size 2 only; asked at 4, M* 8 is kept (a rank's memory
    # does not grow with W), and a batch of 1 per rank is below it.
    two = sample_profile(max_micro_batch_size=8).model_copy(
        update={"world_size": 2, "parallel": Parallel(mode="ddp")}
    )
    upload(http, two)
    asked = tuner(
        "recommend", "--workload", "gpt-test", "--device", "cpu-test", "--global-batch-size",
        "4", "--world-size", "4", "--parallel", "ddp", "--json",
        url=service.url, token=admin_token,
    )  # fmt: skip
    assert asked.returncode == 0, asked.stderr
    answer = json.loads(asked.stdout)
    assert (answer["basis"], answer["micro_batch_size"], answer["max_micro_batch_size"]) == (
        "estimated",
        1,
        8,
    )
    # At most the peak of M*, the size the estimate is for.
    assert answer["expected_peak_bytes"] == two.probe_at(8).peak_bytes  # type: ignore[union-attr]
    shown = tuner(
        "recommend", "--workload", "gpt-test", "--device", "cpu-test", "--global-batch-size",
        "4", "--world-size", "4", "--parallel", "ddp", url=service.url, token=admin_token,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "expected peak 180 MiB" in shown.stdout
    assert "expected peak -" not in shown.stdout


def test_offline_without_a_cached_answer_tells_a_person_what_to_do(tmp_path: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    done = tuner(
        "recommend", "--workload", "gpt-test", "--device", "cpu-test", "--global-batch-size",
        "8", url=nowhere, token="t", cache=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1
    message = " ".join(done.stderr.split())
    assert "fallback=" not in message
    assert "no earlier answer to this question is cached" in message
    assert "--url (or TUNER_URL)" in message


@pytest.mark.parametrize(
    ("m_star", "batch", "said"),
    [
        (13, 25, "(13 + 12), so the peak is that of M* itself"),
        (31, 256, "(4×29 + 5×28), so the peak is that of 29, not of 31"),
    ],
)
def test_a_balanced_reason_reads_as_a_sentence(m_star: int, batch: int, said: str) -> None:
    from tuner.core.plan import recommend

    plan = recommend(max_micro_batch_size=m_star, probes=(), global_batch_size=batch)
    assert plan.reason.endswith(said)
    assert f"{m_star}, not {m_star}" not in plan.reason
