"""BENCHMARKS.md holds the current result of each benchmark (the machine, the date and the
command that made it) in at most 300 lines; history goes to CHANGELOG.md. The README stays
short: the documentation site holds the rest."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers import REPO_ROOT

SECTION = re.compile(r"<!-- begin (\S+) -->\n(.*?)\n<!-- end \1 -->", re.DOTALL)


def test_benchmarks_md_is_the_current_result_of_each_benchmark() -> None:
    text = (REPO_ROOT / "BENCHMARKS.md").read_text()
    assert len(text.splitlines()) <= 300
    sections = SECTION.findall(text)
    # Every section a benchmark rewrites is closed by its own name (else a rerun appends).
    begins = re.findall(r"<!-- begin (\S+) -->", text)
    assert begins == [name for name, _ in sections]
    # Every benchmark that writes a section has one.
    writers = {
        f"bench/{path.name}"
        for path in (REPO_ROOT / "bench").glob("*.py")
        if "write_section(" in path.read_text()
        and path.name != "common.py"
        and not path.name.startswith("test_")
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
