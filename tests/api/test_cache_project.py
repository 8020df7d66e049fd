"""The offline cache keys the whole question, the project it is asked in included: a
switch of TUNER_PROJECT never serves another project's answer."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tuner.client.answer_cache import AnswerCache, Question
from tuner.core.plan import recommend
from tuner.core.wire.recommendation import RecommendationPublic


def test_the_project_is_part_of_the_key_but_not_of_the_query(tmp_path: Path) -> None:
    asked = Question("http://127.0.0.1:8000", "wl", "dev", 64, 1, "balanced")
    other = dataclasses.replace(asked, project="team-b")
    assert asked.digest() != other.digest()
    assert asked.params() == other.params()  # the project travels as a header
    assert "project" not in other.params()
    assert other.document()["project"] == "team-b"
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
