"""``recommend_command`` round-trips: the ``tuner recommend`` command it writes for an
answer, run against the same service (the real one, under uvicorn, over a SQLite file),
prints that same answer. Over the shapes a question takes: one process, a DDP run asked
without its mode, a 2-D mesh (tp), a sequence length of a length family, each
policy, a world size never measured."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.db import Database
from tests.api.conftest import service_over_sqlite
from tests.api.documents import sample_profile
from tests.core.test_mesh_worlds import load
from tests.dashboard.data import store
from tests.dashboard.test_landing import length_profiles
from tests.dashboard.test_world_sizes import DDP_KEY, ddp_profile
from tests.services import ServerThread
from tuner.cli import main
from tuner.core.wire.recommendation import RecommendationPublic, recommend_command


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, str]]:
    directory = tmp_path_factory.mktemp("recommend-command")
    with service_over_sqlite(directory) as (server, token):
        database = Database(f"sqlite:///{directory / 'tuner.db'}")
        profiles = [sample_profile(), ddp_profile(2), ddp_profile(4), *length_profiles()]
        profiles += [load(4, 2), load(8, 2), load(4, 1)]
        store(database, profiles)
        database.dispose()
        yield server, token


MESH = "98515757a6e064e8afd6561a"
QUESTIONS: dict[str, dict[str, Any]] = {
    "one process": {"workload": "w" * 24, "global_batch_size": 100},
    "policy max": {"workload": "w" * 24, "global_batch_size": 100, "policy": "max"},
    "policy even": {"workload": "w" * 24, "global_batch_size": 96, "policy": "even"},
    "throughput": {"workload": "w" * 24, "global_batch_size": 64, "policy": "throughput"},
    "ddp, its own mode": {"workload": DDP_KEY, "global_batch_size": 64, "world_size": 2},
    "ddp at 8, estimated": {"workload": DDP_KEY, "global_batch_size": 128, "world_size": 8},
    "a 2 x 2 mesh": {"workload": MESH, "global_batch_size": 1024, "world_size": 4, "tp": 2},
    "a 4 x 2 mesh": {"workload": MESH, "global_batch_size": 1024, "world_size": 8, "tp": 2},
    "a measured length": {"workload": "len64".ljust(24, "l"), "global_batch_size": 64,
                         "seq_len": 128},
}  # fmt: skip


@pytest.mark.parametrize("name", list(QUESTIONS))
def test_the_command_gives_the_answer_it_was_written_from(
    name: str,
    served: tuple[ServerThread, str],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, token = served
    question = QUESTIONS[name]
    devices = {"w" * 24: "d" * 24, DDP_KEY: "d" * 24, MESH: "21ee8d9ac96265269682a9a6"}
    asked = {"device": devices.get(question["workload"], "d" * 24), **question}
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}) as http:
        response = http.get("/api/v1/recommendation", params=asked)
    assert response.status_code == 200, response.text
    answer = RecommendationPublic.model_validate(response.json())
    command = recommend_command(answer)
    words = shlex.split(command)
    assert words[:2] == ["tuner", "recommend"]
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    status = main([*words[1:], "--json", "--url", server.url, "--token", token])
    assert status == 0, capsys.readouterr().err
    from_cli = json.loads(capsys.readouterr().out)
    expected = answer.model_dump(mode="json")
    for body in (from_cli, expected):
        body.pop("profile_age_s")
    assert from_cli == expected


def test_the_command_asks_in_the_project_it_names(
    served: tuple[ServerThread, str],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--project`` is the question's project: the service answers there (its own, here)
    or refuses in its own words; a question the service would refuse is refused before it
    is sent, in the route's words."""
    server, token = served
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    asked = ["recommend", "--workload", "w" * 24, "--device", "d" * 24, "--global-batch-size"]
    reach = ["--json", "--url", server.url, "--token", token]
    assert main([*asked, "100", "--project", "default", *reach]) == 0
    assert json.loads(capsys.readouterr().out)["workload_key"] == "w" * 24
    assert main([*asked, "100", "--project", "nope", *reach]) != 0
    assert "no project is named 'nope'" in capsys.readouterr().err
    assert main([*asked, "100", "--world-size", "3", *reach]) != 0
    assert "query.world_size: Value error, global batch size 100 is not divisible" in (
        capsys.readouterr().err
    )


def test_the_command_spells_out_every_choice_the_answer_made() -> None:
    answer = RecommendationPublic.model_validate(
        {
            **_an_answer(),
            "workload_key": "it's a key",  # quoted for the shell, whatever it holds
            "tp": 2,
            "world_size": 4,
            "seq_len": 128,
            "parallel": "fsdp",
            "policy": "even",
        }
    )
    assert recommend_command(answer) == (
        "tuner recommend --workload 'it'\"'\"'s a key' --device dev --global-batch-size 64 "
        "--world-size 4 --tp 2 --parallel fsdp --policy even --seq-len 128"
    )


def _an_answer() -> dict[str, Any]:
    return {
        "micro_batch_size": 16,
        "grad_accum": 2,
        "split": [[16, 2]],
        "global_batch_size": 64,
        "world_size": 4,
        "per_rank_batch_size": 32,
        "policy": "balanced",
        "max_micro_batch_size": 16,
        "expected_peak_bytes": None,
        "expected_samples_per_second": None,
        "basis": "measured",
        "workload_key": "w",
        "workload_name": "w",
        "device_key": "dev",
        "device_name": "d",
        "capacity_bytes": 1,
        "headroom": 0.05,
        "profile_id": 1,
        "profile_device_key": "dev",
        "profile_world_size": 4,
        "profile_parallel": "fsdp",
        "profile_created_at": "2026-11-01T00:00:00Z",
        "parallel": "fsdp",
        "profile_age_s": 1.0,
        "oom_limit": None,
        "based_on_profiles": [1],
    }
