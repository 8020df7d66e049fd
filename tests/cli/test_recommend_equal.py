"""``tuner recommend`` says the step as it runs and, where its sizes differ, the equal split a
framework runs, with its warning. In this process, over a database file."""

from __future__ import annotations

from pathlib import Path

import pytest

from api import migrate
from api.db import Database
from tests.api.documents import sample_profile
from tests.dashboard.data import store
from tuner.cli.main import main


def test_the_answer_and_the_equal_split_are_equations_that_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    migrate.upgrade(url)
    database = Database(url)
    store(database, [sample_profile(max_micro_batch_size=15)])
    database.dispose()
    ask = ["recommend", "--url", url, "--workload", "gpt-test", "--device", "cpu-test"]
    assert main([*ask, "--global-batch-size", "256", "--world-size", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "2×15 + 7×14 = 128 samples a step × 2 ranks = global batch 256"
    assert lines[2].startswith(
        "equal micro batches (Trainer, Lightning): micro batch 8 × 16 accumulation steps × 2 "
        "ranks = global batch 256, 123.1 samples/s, estimated, 17% slower"
    )
    assert lines[3].startswith("caution: equal micro batches for global batch 256 are")
    # An equal split is the answer itself: nothing more to say.
    assert main([*ask, "--global-batch-size", "240", "--world-size", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("micro batch 15 × 8 accumulation steps × 2 ranks = global batch 240")
    assert "(Trainer, Lightning)" not in out
