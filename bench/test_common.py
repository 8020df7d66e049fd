"""What ``bench/common.py`` promises the benchmarks that write BENCHMARKS.md: each section
written under its heading with the command that made it, replaced on a rerun, and long
series laid across. Checked with the benchmarks, not by the test suite (tests never import
``bench``): ``python -m pytest bench/test_common.py``; ``tests/test_benchmarks_md.py``
checks the file itself."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench import common

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_a_section_is_written_with_its_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "BENCHMARKS.md"
    monkeypatch.setattr(sys, "argv", [str(REPO_ROOT / "bench" / "peak.py"), "--rounds", "3"])
    common.write_section("peak", "## Peak (`bench/peak.py`)\n\nMachine: here.\n\n| a |", path)
    common.write_section("other", "## Other\n\nMachine: there.", path)
    common.write_section("peak", "## Peak (`bench/peak.py`)\n\nMachine: again.", path)
    text = path.read_text()
    assert text.startswith("# Benchmarks\n")
    assert text.count("<!-- begin peak -->") == 1
    assert (
        "<!-- begin peak -->\n## Peak (`bench/peak.py`)\n\n"
        "Command: `.venv/bin/python bench/peak.py --rounds 3`\n\nMachine: again.\n"
        "<!-- end peak -->"
    ) in text
    assert "Machine: there." in text


def test_a_long_series_reads_across() -> None:
    table = common.transposed_table(["asked", "RSS"], [["0", "93"], ["10", "107"]])
    assert table == "| asked | 0 | 10 |\n|---|---|---|\n| RSS | 93 | 107 |"
