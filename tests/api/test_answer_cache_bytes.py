"""The client's offline cache of answers is bounded in bytes: one answer is small whatever
its batch (the split is kept as runs), and the directory keeps the newest answers up to
``max_bytes``. Real files in a temporary directory."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

from tuner.client.answer_cache import MAX_FILE_BYTES, AnswerCache, Question
from tuner.core import plan
from tuner.core.wire.recommendation import (
    MAX_GLOBAL_BATCH_SIZE,
    RecommendationPublic,
    RecommendationQuery,
)


def _answer(global_batch_size: int, m_star: int) -> RecommendationPublic:
    settings = plan.recommend(
        max_micro_batch_size=m_star, probes=(), global_batch_size=global_batch_size
    )
    return RecommendationPublic(
        **settings.model_dump(),
        workload_key="w" * 24,
        workload_name="gpt-test",
        device_key="d" * 24,
        device_name="cpu-test",
        capacity_bytes=2**30,
        headroom=0.05,
        oom_limit=None,
        profile_id=1,
        profile_device_key="d" * 24,
        profile_world_size=1,
        profile_parallel="none",
        profile_created_at=datetime(2026, 11, 1, tzinfo=UTC),
        parallel="none",
        based_on_profiles=[1],
        profile_age_s=1.0,
    )


def _question(global_batch_size: int) -> Question:
    return Question(
        "http://tuner.test",
        RecommendationQuery(
            workload="gpt-test", device="cpu-test", global_batch_size=global_batch_size
        ),
    )


def _sizes(directory: Path) -> dict[str, int]:
    return {path.name: path.stat().st_size for path in directory.glob("*.json")}


def test_an_answer_at_m_star_1_and_the_largest_batch_is_kept_in_a_few_kib(
    tmp_path: Path,
) -> None:
    cache = AnswerCache(tmp_path)
    heaviest = _answer(MAX_GLOBAL_BATCH_SIZE, 1)
    cache.save(_question(MAX_GLOBAL_BATCH_SIZE), heaviest)
    [size] = _sizes(tmp_path).values()
    assert size < 4096, f"{size} bytes"  # a flat split made it 2 MiB
    [path] = tmp_path.glob("*.json")
    assert json.loads(path.read_text())["answer"]["split"] == [[1, MAX_GLOBAL_BATCH_SIZE]]
    cached = cache.load(_question(MAX_GLOBAL_BATCH_SIZE))
    assert cached is not None
    assert cached.answer == heaviest


def test_the_directory_keeps_the_newest_answers_up_to_max_bytes(tmp_path: Path) -> None:
    one = len(json.dumps(_answer(256, 7).model_dump(mode="json")))
    cache = AnswerCache(tmp_path, max_bytes=10 * one)
    for index, batch in enumerate(range(200, 240)):
        cache.save(_question(batch), _answer(batch, 7))
        # A second apart by the files' times, whatever the file system's resolution.
        stamp = 1_000_000 + index
        for path in tmp_path.glob("*.json"):
            if path.stat().st_mtime > 2_000_000:  # the one just written
                os.utime(path, (stamp, stamp))
    sizes = _sizes(tmp_path)
    assert sum(sizes.values()) <= 10 * one
    assert len(sizes) >= 5  # about a file's worth of room per answer, less the question
    kept = [batch for batch in range(200, 240) if cache.load(_question(batch)) is not None]
    assert kept == list(range(240 - len(kept), 240))  # the newest, every one of them


def test_a_file_larger_than_any_answer_is_not_read(tmp_path: Path) -> None:
    cache = AnswerCache(tmp_path)
    question = _question(256)
    cache.save(question, _answer(256, 7))
    [path] = tmp_path.glob("*.json")
    document = json.loads(path.read_text())
    document["padding"] = "x" * MAX_FILE_BYTES
    path.write_text(json.dumps(document))
    assert cache.load(question) is None
