"""BENCHMARKS.md holds the current result of each benchmark (the machine, the date and the
command that made it) in at most 300 lines; history goes to CHANGELOG.md. The README stays
short: the documentation site holds the rest."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import common
from tests.helpers import REPO_ROOT

SECTION = re.compile(r"<!-- begin (\S+) -->\n(.*?)\n<!-- end \1 -->", re.DOTALL)


def test_benchmarks_md_is_the_current_result_of_each_benchmark() -> None:
    text = (REPO_ROOT / "BENCHMARKS.md").read_text()
    assert len(text.splitlines()) <= 300
    sections = SECTION.findall(text)
    # Every benchmark that writes a section has one.
    writers = {
        f"bench/{path.name}"
        for path in (REPO_ROOT / "bench").glob("*.py")
        if "write_section(" in path.read_text() and path.name != "common.py"
    }
    assert writers <= {body.splitlines()[2].split()[2].rstrip("`") for _, body in sections}
    for name, body in sections:
        heading, blank, command = body.splitlines()[:3]
        assert heading.startswith("## "), name
        assert blank == "", name
        assert re.fullmatch(r"Command: `\.venv/bin/python bench/\w+\.py( [-\w ]+)?`", command), name
        script = command.split()[2].rstrip("`")
        assert (REPO_ROOT / script).is_file(), (name, script)
        assert re.search(r"20\d\d-\d\d-\d\d", body), f"{name}: no date"
        assert "cores" in body, f"{name}: no machine"
    assert "kept for the record" not in text
    assert "Before and after" not in text


def test_history_and_the_readme(tmp_path: Path) -> None:
    changelog = (REPO_ROOT / "CHANGELOG.md").read_text()
    assert changelog.startswith("# Changelog")
    assert "issue 28" in changelog
    assert len((REPO_ROOT / "README.md").read_text().splitlines()) <= 200


def test_a_section_is_written_with_its_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "BENCHMARKS.md"
    monkeypatch.setattr(common.sys, "argv", [str(REPO_ROOT / "bench" / "peak.py"), "--rounds", "3"])
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
