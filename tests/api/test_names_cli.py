"""``tuner recommend --workload NAME --device NAME`` after ordinary use, in this process
against the real service: profiling at two CPU limits (each limit its own device, named
with its limit) and ``--explore --upload`` (variants sharing the workload's name)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.services import ServerThread
from tuner.cli import main

MLP = ("examples.mlp:workload", "-o", "hidden=64", "-o", "layers=1", "--device", "cpu")


@pytest.fixture
def cli(service: ServerThread, admin_token: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_URL", service.url)
    monkeypatch.setenv("TUNER_TOKEN", admin_token)


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    status = main([*args, "--json"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    printed: dict[str, Any] = json.loads(captured.out)
    return printed


@pytest.mark.usefixtures("cli")
def test_names_answer_after_profiling_at_two_cpu_limits(
    http: httpx.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    profiles = [
        _run(capsys, "profile", *MLP, "--memory-limit", limit, "--max", "8", "--upload")
        for limit in ("4MiB", "6MiB")
    ]
    names = [profile["device"]["name"] for profile in profiles]
    assert names[0].endswith(" (4 MiB limit)")
    assert names[1].endswith(" (6 MiB limit)")
    listed = http.get("/api/v1/devices").json()["data"]
    assert sorted(row["name"] for row in listed) == sorted(names)
    workload = profiles[0]["workload"]["name"]
    for profile, name in zip(profiles, names, strict=True):
        answer = _run(
            capsys, "recommend", "--workload", workload, "--device", name,
            "--global-batch-size", "16",
        )  # fmt: skip
        assert answer["profile_id"] == profile["profile_id"]
        assert answer["capacity_bytes"] == profile["device"]["capacity_bytes"]


@pytest.mark.slow
@pytest.mark.usefixtures("cli")
def test_a_name_answers_the_chosen_variant_after_explore_upload(
    http: httpx.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    printed = _run(
        capsys, "profile", "tests.variant_workloads:stack", "--device", "cpu",
        "--memory-limit", "1000000", "--explore", "--upload",
    )  # fmt: skip
    [chosen] = [variant for variant in printed["variants"] if variant["chosen"]]
    answer = _run(
        capsys, "recommend", "--workload", printed["workload"]["name"],
        "--device", printed["device"]["name"], "--global-batch-size", "8",
    )  # fmt: skip
    stored = http.get(f"/api/v1/profiles/{answer['profile_id']}").json()
    assert stored["variant"] == chosen["variant"]
    assert stored["variant_group"] == printed["variant_group"]
