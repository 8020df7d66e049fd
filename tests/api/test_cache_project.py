"""The offline cache keys the whole question, the project it is asked in included: a
switch of TUNER_PROJECT never serves another project's answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.api.documents import sample_profile
from tuner.client import TunerClient
from tuner.client.answer_cache import AnswerCache, Question
from tuner.core.errors import NotFoundError
from tuner.core.plan import recommend
from tuner.core.wire.recommendation import RecommendationPublic, RecommendationQuery


def test_the_project_is_part_of_the_key(tmp_path: Path) -> None:
    query = RecommendationQuery(workload="wl", device="dev", global_batch_size=64)
    asked = Question("http://127.0.0.1:8000", query)
    other = Question(asked.service, query.model_copy(update={"project": "team-b"}))
    assert asked.digest() != other.digest()
    assert other.document()["project"] == "team-b"
    # A question asked as before projects and meshes keeps its file's name.
    assert asked.document() == {
        "service": "http://127.0.0.1:8000",
        "workload": "wl",
        "device": "dev",
        "global_batch_size": 64,
        "world_size": 1,
        "policy": "balanced",
    }
    cache = AnswerCache(tmp_path)
    plan = recommend(max_micro_batch_size=16, probes=(), global_batch_size=64)
    answer = RecommendationPublic.model_validate(
        {
            **plan.model_dump(),
            "workload_key": "wl",
            "workload_name": "model",
            "device_key": "dev",
            "device_name": "cpu",
            "capacity_bytes": 2**30,
            "headroom": 0.05,
            "oom_limit": None,
            "profile_id": 1,
            "profile_device_key": "dev",
            "profile_world_size": 1,
            "profile_parallel": "none",
            "profile_created_at": "2026-01-01T00:00:00Z",
            "parallel": "none",
            "based_on_profiles": [1],
            "profile_age_s": 0.0,
        }
    )
    cache.save(other, answer)
    assert cache.load(asked) is None
    kept = cache.load(other)
    assert kept is not None
    assert kept.answer.equal == answer.equal


def test_ask_takes_the_wire_question_and_keys_the_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, cache = f"sqlite:///{tmp_path / 'tuner.db'}", tmp_path / "cache"
    query = RecommendationQuery(
        workload="gpt-test", device="cpu-test", global_batch_size=256, world_size=2
    )
    with TunerClient(url, cache_dir=cache) as client:
        client.upload_profile(sample_profile(max_micro_batch_size=15))
        asked = client.ask(query)
        said = client.recommend(
            workload="gpt-test", device="cpu-test", global_batch_size=256, world_size=2
        )
    assert asked.model_dump(exclude={"profile_age_s"}) == said.model_dump(exclude={"profile_age_s"})
    assert len(list(cache.glob("*.json"))) == 1  # one question, one key
    monkeypatch.setenv("TUNER_PROJECT", "team-b")
    with TunerClient(url, cache_dir=cache) as other, pytest.raises(NotFoundError):
        other.ask(query)  # asked in team-b, which has no profile of it
