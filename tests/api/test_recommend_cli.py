"""``tuner recommend`` and ``tuner profile --upload`` as real subprocesses against the
running service, configured through TUNER_URL and TUNER_TOKEN (or --url and --token)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.api.builders import profile_with_speeds, upload
from tests.api.documents import MiB, sample_profile
from tests.services import ServerThread
from tuner.cli import main
from tuner.core.plan import recommend
from tuner.core.shape import MeshShape

ROOT = Path(__file__).resolve().parents[2]
TUNER = str(ROOT / ".venv" / "bin" / "tuner")


def tuner(
    *args: str, url: str | None = None, token: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TUNER_URL", "TUNER_TOKEN")}
    env["COLUMNS"] = "200"
    if url is not None:
        env["TUNER_URL"] = url
    if token is not None:
        env["TUNER_TOKEN"] = token
    return subprocess.run(
        [TUNER, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


ASK = ("recommend", "--workload", "gpt-test", "--device", "cpu-test")


def test_recommend_prints_the_settings_and_where_they_come_from(
    http: httpx.Client, service: ServerThread, admin_token: str
) -> None:
    profile = profile_with_speeds({1: 10.0, 8: 80.0, 12: 90.0}, max_micro_batch_size=12)
    stored = upload(http, profile)
    done = tuner(
        *ASK, "--global-batch-size", "80", "--world-size", "2", url=service.url, token=admin_token
    )
    assert done.returncode == 0, done.stderr
    expected = recommend(
        max_micro_batch_size=12, probes=profile.probes, global_batch_size=80, mesh=MeshShape(2)
    )
    lines = done.stdout.splitlines()
    assert lines[0] == expected.describe()
    assert lines[1] == expected.reason
    assert lines[1].startswith("balanced: ")
    assert f"measured by profile {stored['id']}" in lines[2]
    assert "expected peak 220 MiB" in lines[3]
    assert "90.0 samples/s" in lines[3]


def test_recommend_json_with_url_and_token_options(
    http: httpx.Client, service: ServerThread, admin_token: str
) -> None:
    upload(http, profile_with_speeds({1: 10.0, 8: 99.0, 12: 90.0}, max_micro_batch_size=12))
    done = tuner(
        *ASK,
        "--global-batch-size",
        "40",
        "--policy",
        "throughput",
        "--json",
        "--url",
        service.url,
        "--token",
        admin_token,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert (answer["micro_batch_size"], answer["split"], answer["basis"]) == (
        8,
        [[8, 5]],  # runs [size, count]
        "measured",
    )


@pytest.mark.slow
def test_recommend_failures_exit_with_a_status_and_a_message(
    http: httpx.Client, service: ServerThread, admin_token: str
) -> None:
    upload(http, sample_profile())
    unknown = tuner(
        "recommend",
        "--workload",
        "nope",
        "--device",
        "cpu-test",
        "--global-batch-size",
        "8",
        url=service.url,
        token=admin_token,
    )
    assert unknown.returncode == 1
    assert "no workload has the key or name 'nope'" in unknown.stderr

    uneven = tuner(
        *ASK, "--global-batch-size", "10", "--world-size", "3", url=service.url, token=admin_token
    )
    assert uneven.returncode == 2
    assert "not divisible by world size 3" in uneven.stderr

    no_url = tuner(*ASK, "--global-batch-size", "8")
    assert no_url.returncode == 2
    assert "set TUNER_URL" in no_url.stderr

    no_token = tuner(*ASK, "--global-batch-size", "8", url=service.url)
    assert no_token.returncode == 1
    assert "needs a token" in no_token.stderr

    bad_policy = tuner(*ASK, "--global-batch-size", "8", "--policy", "fast", url=service.url)
    assert bad_policy.returncode == 2

    upload(
        http, sample_profile(max_micro_batch_size=0, workload_key="z" * 24, workload_name="huge")
    )
    nothing = tuner(
        "recommend",
        "--workload",
        "huge",
        "--device",
        "cpu-test",
        "--global-batch-size",
        "8",
        url=service.url,
        token=admin_token,
    )
    assert nothing.returncode == 3
    assert "not even a micro batch of 1" in nothing.stderr


MLP = ("examples.mlp:workload", "-o", "hidden=64", "-o", "layers=1", "--device", "cpu")


@pytest.mark.slow
def test_profile_upload_stores_the_profile_and_prints_its_id(
    http: httpx.Client, service: ServerThread, admin_token: str
) -> None:
    done = tuner(
        "profile",
        *MLP,
        "--memory-limit",
        "4MiB",
        "--max",
        "64",
        "--json",
        "--upload",
        url=service.url,
        token=admin_token,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    profile_id = printed["profile_id"]
    assert f"uploaded as profile {profile_id} to {service.url}" in done.stderr
    stored = http.get(f"/api/v1/profiles/{profile_id}").json()
    assert stored["workload_key"] == printed["workload_key"]
    assert stored["workload"]["target"] == "examples.mlp:workload"
    assert len(stored["probes"]) == len(printed["probes"])

    asked = tuner(
        "recommend",
        "--workload",
        printed["workload_key"],
        "--device",
        printed["device_key"],
        "--global-batch-size",
        "128",
        "--json",
        url=service.url,
        token=admin_token,
    )
    assert asked.returncode == 0, asked.stderr
    answer = json.loads(asked.stdout)
    assert answer["profile_id"] == profile_id
    assert answer["micro_batch_size"] == printed["max_micro_batch_size"]


def test_profile_upload_without_a_url_fails_before_probing() -> None:
    done = tuner("profile", *MLP, "--memory-limit", "4MiB", "--upload")
    assert done.returncode == 2
    assert "set TUNER_URL" in done.stderr
    assert "probe" not in done.stderr  # nothing was measured


# The same commands in this process, so that coverage sees them.


def test_recommend_in_process_shows_an_estimate_and_the_oom_limit(
    http: httpx.Client,
    service: ServerThread,
    admin_token: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    upload(http, sample_profile())
    big = {"key": "g" * 24, "kind": "cuda", "name": "big-gpu", "capacity_bytes": 800 * MiB}
    http.post("/api/v1/devices", json=big)
    http.post(
        "/api/v1/oom-reports",
        json={"workload": "gpt-test", "device": "big-gpu", "micro_batch_size": 40},
    )
    monkeypatch.setenv("TUNER_URL", service.url)
    monkeypatch.setenv("TUNER_TOKEN", admin_token)
    status = main(
        ["recommend", "--workload", "gpt-test", "--device", "big-gpu", "--global-batch-size", "78"]
    )
    out = capsys.readouterr().out.splitlines()
    assert status == 0
    assert out[0] == "micro batch 39 × 2 accumulation steps = global batch 78"
    assert out[1] == "balanced: 2 equal micro batches of 39, the fewest that fit M* = 39"
    assert "estimated from profile 1 on device " + "d" * 24 in out[2]
    assert out[3].startswith("estimated: expected peak 490 MiB, headroom 310 MiB")
    assert "kept below micro batch 40" in out[4]

    status = main([*ASK, "--global-batch-size", "8", "--device", "nothing-here"])
    assert status == 1
    assert "no device has the key or name" in capsys.readouterr().err


def test_profile_upload_in_process_prints_the_id(
    http: httpx.Client,
    service: ServerThread,
    admin_token: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TUNER_URL", service.url)
    monkeypatch.setenv("TUNER_TOKEN", admin_token)
    status = main(["profile", *MLP, "--memory-limit", "4MiB", "--max", "8", "--upload"])
    assert status == 0
    out = capsys.readouterr().out
    listed = http.get("/api/v1/profiles").json()["data"]
    assert f"uploaded as profile {listed[0]['id']} to {service.url}" in out

    monkeypatch.setenv("TUNER_TOKEN", "mbt_unknown")
    status = main(["profile", *MLP, "--memory-limit", "4MiB", "--max", "8", "--upload"])
    assert status == 1
    captured = capsys.readouterr()
    assert "largest micro batch that fits: 8" in captured.out  # still shown
    assert "the profile was not uploaded: unknown token" in captured.err


def test_profile_seq_lens_upload_refused_still_prints_every_length(
    service: ServerThread,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--seq-lens goes through the plain profile's steps: a refused upload keeps the
    measurements on screen, says so in one line and exits 1."""
    monkeypatch.setenv("TUNER_URL", service.url)
    monkeypatch.setenv("TUNER_TOKEN", "mbt_unknown")
    gpt = ["examples.gpt:workload", "-o", "vocab=64", "-o", "dim=16", "-o", "layers=1",
           "-o", "heads=2", "--device", "cpu", "--memory-limit", "1MiB"]  # fmt: skip
    status = main(["profile", *gpt, "--seq-lens", "16,32", "--upload"])
    assert status == 1
    captured = capsys.readouterr()
    assert "Sequence lengths (measured)" in captured.out
    assert "uploaded as" not in captured.out + captured.err
    assert "the profiles were not uploaded: unknown token" in captured.err
