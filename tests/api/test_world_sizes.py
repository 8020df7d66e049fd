"""World size and parallel mode end to end, on real measurements: a DDP profile at two
ranks measured and uploaded by ``tuner profile``, one at four ranks measured by the
launcher, and a one-process profile, all of one tiny GPT on the CPU under one limit.

Which are real: every profile here is measured (gloo rank processes on 127.0.0.1 for
DDP); none is written by hand. They are measured once for the module, against one
service over a SQLite file; the answers are then asked through ``tuner recommend``, the
REST endpoint and the client.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import service_over_sqlite
from tests.api.test_recommend_cli import tuner
from tests.services import ServerThread
from tuner.client import TunerClient
from tuner.core import worlds
from tuner.core.parallel import Parallel
from tuner.core.results import Profile
from tuner.core.shape import MeshShape
from tuner.engine.backends import make_backend
from tuner.engine.launch import profile_distributed
from tuner.engine.profiler import profile_workload
from tuner.engine.workload import load_workload

# The smallest model whose DDP profile is quick and whose M* sits below the cap.
GPT = {"layers": 1, "dim": 64, "heads": 2, "vocab": 2048, "seq_len": 8}
OPTIONS = [arg for name, value in GPT.items() for arg in ("-o", f"{name}={value}")]
LIMIT = "6MiB"
LIMIT_BYTES = 6 * 2**20
CAP = 16
PROBE_TIMEOUT_S = 120


@dataclass(frozen=True)
class Measured:
    url: str
    token: str
    ddp2: Profile  # measured and uploaded by `tuner profile --world-size 2 --parallel ddp`
    ddp2_id: int
    ddp4: Profile  # measured by the launcher on four ranks, uploaded by the client
    ddp4_id: int
    one_process: Profile  # measured in this process


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Measured]:
    with service_over_sqlite(tmp_path_factory.mktemp("worlds")) as (server, token):
        done = tuner(
            "profile", "examples.gpt:workload", *OPTIONS, "--memory-limit", LIMIT,
            "--max", str(CAP), "--world-size", "2", "--parallel", "ddp", "--no-explore",
            "--upload", "--json",
            url=server.url, token=token, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        document = json.loads(done.stdout)
        ddp2 = Profile.model_validate(
            {k: v for k, v in document.items() if k in Profile.model_fields}
        )
        four = profile_distributed(
            "examples.gpt:workload",
            options=GPT,
            device="cpu",
            memory_limit_bytes=LIMIT_BYTES,
            world_size=4,
            parallel=Parallel(mode="ddp"),
            headroom=0.05,
            strategy="model",
            size_cap=CAP,
            probe_timeout_s=PROBE_TIMEOUT_S,
        )
        one = profile_workload(
            load_workload("examples.gpt:workload", GPT),
            make_backend("cpu", memory_limit_bytes=LIMIT_BYTES),
            size_cap=CAP,
        )
        with TunerClient(server.url, token=token) as client:
            four_id = client.upload_profile(four).id
            client.upload_profile(one)
            [ddp2_id] = [
                p.id
                for p in client.list_profiles(workload=ddp2.workload_key).data
                if p.world_size == 2
            ]
        yield Measured(server.url, token, ddp2, ddp2_id, four, four_id, one)


def _rest(measured: Measured, **params: object) -> dict[str, object]:
    query = {"workload": measured.ddp2.workload.name, "device": measured.ddp2.device_key}
    response = httpx.get(
        f"{measured.url}/api/v1/recommendation",
        params={**query, **params},
        headers={"Authorization": f"Bearer {measured.token}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    body: dict[str, object] = response.json()
    return body


@pytest.mark.slow
def test_the_ddp_profile_uploaded_from_the_cli_answers_ddp_at_two_ranks(
    measured: Measured,
) -> None:
    assert (measured.ddp2.world_size, measured.ddp2.parallel.mode) == (2, "ddp")
    assert 1 <= measured.ddp2.max_micro_batch_size < CAP
    done = tuner(
        "recommend", "--workload", measured.ddp2.workload.name,
        "--device", measured.ddp2.device_key, "--global-batch-size", "32",
        "--world-size", "2", "--parallel", "ddp", "--json",
        url=measured.url, token=measured.token,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    cli = json.loads(done.stdout)
    rest = _rest(measured, global_batch_size=32, world_size=2, parallel="ddp")
    for answer in (cli, rest):
        assert answer["basis"] == "measured"
        assert answer["profile_id"] == measured.ddp2_id
        assert answer["based_on_profiles"] == [measured.ddp2_id]
        assert (answer["profile_world_size"], answer["profile_parallel"]) == (2, "ddp")
        assert answer["workload_key"] == measured.ddp2.workload_key
        assert answer["max_micro_batch_size"] == measured.ddp2.max_micro_batch_size
        assert answer["one_process_only"] is False
        assert answer["caveat"] is None
    # The one-process profile (same name, its own key) answers the one-process question.
    alone = _rest(measured, global_batch_size=32, parallel="none")
    assert alone["workload_key"] == measured.one_process.workload_key
    assert alone["max_micro_batch_size"] == measured.one_process.max_micro_batch_size


@pytest.mark.slow
def test_three_ranks_are_estimated_from_the_profiles_at_two_and_four(
    measured: Measured,
) -> None:
    answer = _rest(measured, global_batch_size=36, world_size=3, parallel="ddp")
    expected = worlds.estimate_world_size([measured.ddp2, measured.ddp4], MeshShape(3))
    assert answer["basis"] == "estimated"
    assert answer["based_on_profiles"] == [measured.ddp2_id, measured.ddp4_id]
    assert answer["max_micro_batch_size"] == expected.max_micro_batch_size
    assert answer["expected_error"] == pytest.approx(expected.fit.max_relative_error)
    # Never above what ran at the nearest measured world size above.
    assert 1 <= expected.max_micro_batch_size <= measured.ddp4.max_micro_batch_size
    done = tuner(
        "recommend", "--workload", measured.ddp2.workload.name,
        "--device", measured.ddp2.device_key, "--global-batch-size", "36",
        "--world-size", "3", "--parallel", "ddp",
        url=measured.url, token=measured.token,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (
        f"estimated across world sizes from profiles {measured.ddp2_id}, {measured.ddp4_id}"
        in done.stdout
    )


@pytest.mark.slow
def test_an_fsdp_run_with_only_a_one_process_profile_is_told_so(measured: Measured) -> None:
    answer = _rest(measured, global_batch_size=32, world_size=2, parallel="fsdp")
    assert answer["one_process_only"] is True
    assert answer["basis"] == "estimated"
    assert answer["profile_parallel"] == "none"
    assert answer["workload_key"] == measured.one_process.workload_key
    assert "only measured in one process, not under fsdp on 2 ranks" in str(answer["caveat"])


def test_a_ddp_run_with_only_a_one_process_profile_is_told_so(
    http: httpx.Client, service: ServerThread, admin_token: str, tmp_path: Path
) -> None:
    """Against a fresh store (SQLite and PostgreSQL) holding the one-process profile only."""
    from tests.api.builders import upload
    from tests.api.documents import sample_profile

    upload(http, sample_profile(max_micro_batch_size=8))
    response = http.get(
        "/api/v1/recommendation",
        params={
            "workload": "gpt-test",
            "device": "cpu-test",
            "global_batch_size": 16,
            "world_size": 2,
            "parallel": "ddp",
        },
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    assert (answer["one_process_only"], answer["basis"]) == (True, "estimated")
    assert (answer["parallel"], answer["profile_parallel"]) == ("ddp", "none")
    assert "only measured in one process, not under ddp on 2 ranks" in answer["caveat"]
    assert "all-reduce buckets" in answer["caveat"]
    done = tuner(
        "recommend", "--workload", "gpt-test", "--device", "cpu-test",
        "--global-batch-size", "16", "--world-size", "2", "--parallel", "ddp",
        url=service.url, token=admin_token,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "(one process)" in done.stdout
    assert "caution: this workload was only measured in one process" in done.stdout


def test_a_name_shared_by_variants_answers_each_mode_and_each_world_size(
    http: httpx.Client,
) -> None:
    """Hand-written documents (SQLite and PostgreSQL): a one-process profile (M* 8) and
    a DDP variant of the same model at two ranks (M* 6), under one name."""
    from tests.api.builders import error_of, upload
    from tests.api.documents import sample_profile

    one = upload(http, sample_profile(max_micro_batch_size=8))
    ddp = sample_profile(max_micro_batch_size=6, workload_key="p" * 24).model_copy(
        update={"world_size": 2, "parallel": Parallel(mode="ddp")}
    )
    two = upload(http, ddp)

    def ask(**params: object) -> httpx.Response:
        query = {"workload": "gpt-test", "device": "cpu-test", "global_batch_size": 24}
        return http.get("/api/v1/recommendation", params={**query, **params})

    alone = ask().json()  # no mode asked: the name's one-process workload
    assert (alone["profile_id"], alone["parallel"], alone["caveat"]) == (one["id"], "none", None)
    measured = ask(world_size=2, parallel="ddp").json()
    assert (measured["profile_id"], measured["basis"]) == (two["id"], "measured")
    assert measured["max_micro_batch_size"] == 6
    # One smaller world size measured: its M* is kept, estimated, and said so.
    wider = ask(world_size=4, parallel="ddp").json()
    assert (wider["basis"], wider["max_micro_batch_size"]) == ("estimated", 6)
    assert wider["based_on_profiles"] == [two["id"]]
    assert "measured at world size 2 only" in wider["caveat"]
    # A larger one is no ceiling for fewer ranks: the answer says to measure.
    fewer = error_of(ask(world_size=1, parallel="ddp"), 404)
    assert "at world size 2 only" in fewer["message"]
    # The DDP workload by key, asked as another mode, is refused with what to ask.
    wrong = error_of(ask(workload="p" * 24, world_size=2, parallel="fsdp"), 422)
    assert "ask with parallel=ddp" in wrong["message"]
