"""What every benchmark shares: a description of the machine and the BENCHMARKS.md writer."""

from __future__ import annotations

import os
import platform
import re
from datetime import UTC, datetime
from pathlib import Path

BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
_HEADER = (
    "# Benchmarks\n\nEach section is written by the benchmark named in it; rerun it to refresh.\n"
)


def machine_line() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{platform.system()} {cpu}, {os.cpu_count()} cores, {memory:.0f} GiB RAM, "
        f"Python {platform.python_version()}, torch {torch.__version__}, "
        f"{datetime.now(UTC).strftime('%Y-%m-%d')}"
    )


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def write_section(name: str, body: str, path: Path = BENCHMARKS_MD) -> None:
    """Replace the section between ``<!-- begin NAME -->`` and ``<!-- end NAME -->``."""
    text = path.read_text() if path.exists() else _HEADER
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    section = f"{begin}\n{body.strip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    path.write_text(text)
