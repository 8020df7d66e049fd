"""Each fast path of the recommendation answers what its ordinary counterpart answers, byte
for byte but for the answer's age: the ``CachedAnswers`` middleware and the route, prepared
reads and SQLAlchemy Core, the hand-read query and FastAPI's ``Query()`` model, the answer
kept as JSON bytes and serialized per request (``bench/fast_paths.py`` times each).

A real SQLite file of 150 profiles (3 workloads × 10 devices × 5 of history) and two devices
without a profile, so that measured and estimated answers are both asked."""

from __future__ import annotations

from pathlib import Path

from api.config import ServiceSettings
from api.main import create_app
from bench.fast_paths import answers_under_each
from bench.service import fill_store


def test_every_fast_path_answers_as_its_ordinary_path(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    token, paths = fill_store(url, workloads=3, devices=10, history=5)
    app = create_app(ServiceSettings(database_url=url, access_log=False))
    said = answers_under_each(app, url, paths, token)
    served = said.pop("all on (as served)")
    assert len(served) == len(paths) == 36
    assert any(b'"basis":"estimated"' in answer for answer in served)
    assert any(b'"basis":"measured"' in answer for answer in served)
    for name, answers in said.items():
        assert answers == served, name
