"""Answers by sequence length and by tokens, end to end, on real measurements.

A tiny GPT is profiled on the CPU under one memory limit by ``tuner profile --seq-lens
16,32,64 --upload`` (one family of lengths, stored by one service over a SQLite file) and,
held out, at 48 in this process. A length that was profiled is answered from its own profile; 48 is
estimated from the fit across the three and checked against its own measurement; the
tokens of packed micro batches are checked and planned. Asked through the REST endpoint,
the client and ``tuner recommend``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.builders import error_of
from tests.api.conftest import service_over_sqlite
from tests.api.test_recommend_cli import tuner
from tuner.client import TunerClient
from tuner.core.errors import BadInputError
from tuner.core.results import Profile
from tuner.engine.backends import make_backend
from tuner.engine.profiler import profile_workload
from tuner.engine.workload import load_workload

GPT = {"layers": 1, "dim": 64, "heads": 2, "vocab": 512}
LIMIT_BYTES = 8 * 2**20
CAP = 128
MEASURED = (16, 32, 64)
HELD_OUT = 48
OPTIONS = [arg for name, value in GPT.items() for arg in ("-o", f"{name}={value}")]


@dataclass(frozen=True)
class Family:
    url: str
    token: str
    key: str  # the length family's
    profiles: dict[int, Profile]  # by seq_len, the held-out one included (not uploaded)
    ids: dict[int, int]  # the uploaded ones' profile ids


def _profile(seq_len: int) -> Profile:
    """Measured here, at one length: it knows its length and belongs to no family."""
    return profile_workload(
        load_workload("examples.gpt:workload", {**GPT, "seq_len": seq_len}),
        make_backend("cpu", memory_limit_bytes=LIMIT_BYTES),
        size_cap=CAP,
    )


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Family]:
    with service_over_sqlite(tmp_path_factory.mktemp("lengths")) as (server, token):
        done = tuner(
            "profile", "examples.gpt:workload", *OPTIONS, "--memory-limit", f"{LIMIT_BYTES}B",
            "--max", str(CAP), "--seq-lens", ",".join(map(str, MEASURED)), "--upload",
            "--json",
            url=server.url, token=token, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        document = json.loads(done.stdout)
        profiles = {
            p["workload"]["seq_len"]: Profile.model_validate(
                {k: v for k, v in p.items() if k in Profile.model_fields}
            )
            for p in document["profiles"]
        }
        profiles[HELD_OUT] = _profile(HELD_OUT)
        with TunerClient(server.url, token=token) as client:
            ids = {
                s: client.list_profiles(workload=profiles[s].workload_key).data[0].id
                for s in MEASURED
            }
        yield Family(server.url, token, document["length_family"], profiles, ids)


def _ask(family: Family, **params: Any) -> httpx.Response:
    query = {
        "workload": family.profiles[16].workload_key,
        "device": family.profiles[16].device_key,
        "global_batch_size": 96,
        **params,
    }
    return httpx.get(
        f"{family.url}/api/v1/recommendation",
        params=query,
        headers={"Authorization": f"Bearer {family.token}"},
        timeout=30,
    )


def _answer(family: Family, **params: Any) -> dict[str, Any]:
    response = _ask(family, **params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


@pytest.mark.slow
def test_a_profiled_length_is_answered_from_its_own_profile(family: Family) -> None:
    answer = _answer(family, seq_len=64)
    m_star = family.profiles[64].max_micro_batch_size
    assert answer["workload_key"] == family.profiles[64].workload_key  # asked by another length
    assert answer["profile_id"] == family.ids[64]
    assert (answer["basis"], answer["length_basis"]) == ("measured", "measured")
    assert answer["max_micro_batch_size"] == m_star
    assert answer["seq_len"] == 64
    assert answer["length_family"] == family.key
    assert answer["tokens_per_micro_batch"] == answer["micro_batch_size"] * 64
    assert answer["max_tokens_per_micro_batch"] == m_star * 64
    without = _answer(family)  # the workload's own shape, as before: no length fields
    assert without["seq_len"] is None
    assert without["max_micro_batch_size"] == family.profiles[16].max_micro_batch_size


def test_a_length_between_is_estimated_at_or_one_below_its_measured_m_star(
    family: Family,
) -> None:
    answer = _answer(family, seq_len=HELD_OUT)
    truth = family.profiles[HELD_OUT]
    assert (answer["basis"], answer["length_basis"]) == ("estimated", "estimated")
    assert answer["measured_seq_lens"] == list(MEASURED)
    assert sorted(answer["based_on_profiles"]) == sorted(family.ids.values())
    assert truth.max_micro_batch_size - 1 <= answer["max_micro_batch_size"]
    assert answer["max_micro_batch_size"] <= truth.max_micro_batch_size  # never above
    assert answer["expected_error"] is not None
    assert answer["expected_error"] < 0.02
    probe = truth.probe_at(answer["max_micro_batch_size"])
    if probe is not None and answer["expected_peak_bytes"] is not None:
        measured = probe.footprint_bytes or 0
        assert abs(answer["expected_peak_bytes"] - measured) / measured < 0.02
    assert answer["tokens_per_micro_batch"] == answer["micro_batch_size"] * HELD_OUT


def test_the_family_key_names_the_workload_too(family: Family) -> None:
    answer = _answer(family, workload=family.key, seq_len=32)
    assert answer["profile_id"] == family.ids[32]


def test_lengths_too_far_from_the_measured_ones_are_refused_in_one_line(
    family: Family,
) -> None:
    longest = int(64 * 1.25)
    assert _answer(family, seq_len=longest)["length_basis"] == "estimated"
    error = error_of(_ask(family, seq_len=longest + 1), 422)
    assert error["code"] == "bad_input"
    assert "\n" not in error["message"]
    assert "--seq-lens 16,32,64,81" in error["message"]
    assert str(longest) in error["message"]
    shortest = error_of(_ask(family, seq_len=7), 422)["message"]
    assert "answers reach 8 to 80" in shortest


def test_packed_micro_batches_stay_within_their_tokens_and_a_budget_too_big_is_refused(
    family: Family,
) -> None:
    m_star = family.profiles[32].max_micro_batch_size
    assert m_star >= 4
    budget = 3 * 32
    packed = _answer(family, seq_len=32, tokens_per_micro_batch=budget)
    assert max(size for size, _ in packed["split"]) <= 3
    assert sum(size * count for size, count in packed["split"]) == 96
    assert packed["tokens_per_micro_batch"] <= budget
    too_many = (m_star + 1) * 32
    error = error_of(_ask(family, seq_len=32, tokens_per_micro_batch=too_many), 422)
    assert f"at most {m_star * 32} tokens" in error["message"]
    not_whole = error_of(_ask(family, seq_len=32, tokens_per_micro_batch=100), 422)
    assert "multiple of seq_len 32" in not_whole["message"]
    alone = error_of(_ask(family, tokens_per_micro_batch=64), 422)
    assert "needs seq_len" in alone["message"]


def test_a_workload_outside_any_family_says_how_to_profile_lengths(
    family: Family, tmp_path: Path
) -> None:
    lone = _profile(24)
    assert (lone.workload.seq_len, lone.workload.length_family) == (24, None)
    with TunerClient(family.url, token=family.token) as client:
        client.upload_profile(lone)
        same = client.recommend(
            workload=lone.workload_key,
            device=lone.device_key,
            global_batch_size=8,
            seq_len=24,
        )
        assert same.max_micro_batch_size == lone.max_micro_batch_size
        with pytest.raises(BadInputError, match="--seq-lens"):
            client.recommend(
                workload=lone.workload_key,
                device=lone.device_key,
                global_batch_size=8,
                seq_len=32,
            )


def test_the_client_and_the_cli_ask_by_length(family: Family, tmp_path: Path) -> None:
    key, device = family.profiles[16].workload_key, family.profiles[16].device_key
    with TunerClient(family.url, token=family.token, cache_dir=tmp_path) as client:
        by_length = client.recommend(
            workload=key, device=device, global_batch_size=96, seq_len=HELD_OUT
        )
        own_shape = client.recommend(workload=key, device=device, global_batch_size=96)
    assert by_length.length_basis == "estimated"
    assert own_shape.seq_len is None
    assert len(list(tmp_path.glob("**/*.json"))) == 2  # two questions, cached apart
    done = tuner(
        "recommend", "--workload", key, "--device", device, "--global-batch-size", "96",
        "--seq-len", str(HELD_OUT),
        url=family.url, token=family.token,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"seq_len {HELD_OUT}: " in done.stdout
    assert "estimated from seq_len 16, 32, 64" in done.stdout
    assert f"at most {by_length.max_tokens_per_micro_batch:,}" in done.stdout
    as_json = tuner(
        "recommend", "--workload", key, "--device", device, "--global-batch-size", "96",
        "--seq-len", "32", "--tokens-per-micro-batch", "64", "--json",
        url=family.url, token=family.token,
    )  # fmt: skip
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["tokens_per_micro_batch"] <= 64
