"""What every benchmark shares: a description of the machine and the BENCHMARKS.md writer."""

from __future__ import annotations

import os
import platform
import re
import sys
from datetime import UTC, datetime
from pathlib import Path

BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
_HEADER = (
    "# Benchmarks\n\nThe current result of each benchmark: the machine, the date and the command "
    "that made it. Each section is written by its command; rerun it to refresh. Earlier "
    "results, with the change each measured, are in [CHANGELOG.md](CHANGELOG.md).\n"
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


def command_line(argv: list[str] | None = None) -> str:
    """The command that is running, as a reader reruns it from the repository root."""
    script, *arguments = sys.argv if argv is None else argv
    path = Path(script).resolve()
    root = BENCHMARKS_MD.parent
    shown = path.relative_to(root).as_posix() if path.is_relative_to(root) else script
    return " ".join([".venv/bin/python", shown, *arguments])


def transposed_table(header: list[str], rows: list[list[str]]) -> str:
    """A table with one row per column of ``header`` and one column per row: a long series
    (memory after every 10,000 questions, say) in a few lines."""
    columns = [header, *rows]
    lines = [
        "| " + " | ".join(column[index] for column in columns) + " |"
        for index in range(len(header))
    ]
    return "\n".join([lines[0], "|" + "---|" * len(columns), *lines[1:]])


def write_section(name: str, body: str, path: Path = BENCHMARKS_MD) -> None:
    """Replace the section between ``<!-- begin NAME -->`` and ``<!-- end NAME -->``, with
    the command that made it under the section's heading."""
    text = path.read_text() if path.exists() else _HEADER
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    heading, _, rest = body.strip().partition("\n")
    body = f"{heading}\n\nCommand: `{command_line()}`\n{rest}"
    section = f"{begin}\n{body.strip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    path.write_text(text)
