"""``bench/corpus.py --quick``: the corpus runs its paths through the real CLI against a
real ``tuner serve`` it starts, prints its table, and writes nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import subprocess_env

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_quick_corpus_profiles_uploads_answers_and_trains_the_lstm() -> None:
    benchmarks = (REPO / "BENCHMARKS.md").read_text()
    done = subprocess.run(
        [sys.executable, "bench/corpus.py", "--quick", "--paths", "profile,upload,recommend,train"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env=subprocess_env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("| lstm |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[:2] == ["lstm", "recurrent"]
    assert all(cell.startswith("pass") for cell in cells[2:]), row
    assert "4 pass, 0 fail, 0 n.a." in done.stdout
    assert (REPO / "BENCHMARKS.md").read_text() == benchmarks  # a quick run writes nothing
