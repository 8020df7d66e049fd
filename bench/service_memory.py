"""The service's memory under 100,000 distinct recommendation questions.

Answers are not kept in the process (each is decided afresh by ``tuner.answer``); what
stays is the token-check cache (``api.cache``), bounded in entries. Anything that grew with
every new question would let a client that never repeats itself grow the server without
bound. This asks ``tuner serve`` (one process, SQLite) 100,000 questions that are all
different (workload, device, global batch size, world size and policy), and records the
server's resident memory (``VmRSS``) as it goes.

The padded case asks one question spelled many ways: padded with ``&`` up to the longest
query string the service takes (4 KiB), the padding moved by one byte each time, then
padded with 63,000 ``&`` (past the limit: 414): nothing is kept per spelling, so the
server's memory stays flat.

Run: ``python bench/service_memory.py`` (both cases), ``--case padded`` or ``--case
distinct`` for one, ``--quick`` for a smoke run that writes nothing.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from api.cache import GenerationCache
from api.config import ServiceSettings
from bench.common import machine_line, transposed_table, write_section
from bench.service import fill_store, start
from tests.services import free_port


def resident_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def questions(paths: list[str]) -> itertools.chain[str]:
    """Distinct questions: each stored pair with every batch size, world size and policy."""
    return itertools.chain.from_iterable(
        (
            f"{path.split('&global_batch_size=')[0]}&global_batch_size={batch * world}"
            f"&world_size={world}&policy={policy}"
            for path in paths
        )
        for batch in itertools.count(64)
        for world in (1, 2)
        for policy in ("balanced", "max")
    )


def padded(path: str, spelling: int, length: int) -> str:
    """``path``'s question with its query string padded with ``&`` to ``length`` bytes,
    the padding split differently for each ``spelling``."""
    head, _, query = path.partition("?")
    padding = length - len(query)
    before = spelling % padding
    return f"{head}?{'&' * before}{query}{'&' * (padding - before)}"


def ask_padded(
    client: httpx.Client, pid: int, path: str, *, total: int, every: int, length: int
) -> tuple[list[list[str]], dict[int, int]]:
    """RSS every ``every`` of ``total`` askings of ``path`` padded to ``length`` bytes."""
    rows = [["0", f"{resident_mib(pid):.0f}"]]
    statuses: dict[int, int] = {}
    with ThreadPoolExecutor(4) as pool:
        for done in range(every, total + 1, every):
            spellings = [padded(path, n, length) for n in range(done - every, done)]
            for status in pool.map(lambda p: client.get(p).status_code, spellings):
                statuses[status] = statuses.get(status, 0) + 1
            rows.append([f"{done:,}", f"{resident_mib(pid):.0f}"])
            print("  ".join(rows[-1]), flush=True)
    return rows, statuses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="service memory under distinct questions")
    parser.add_argument("--quick", action="store_true", help="small smoke run; writes nothing")
    parser.add_argument("--case", choices=("distinct", "padded", "both"), default="both")
    args = parser.parse_args(argv)
    if args.case in ("padded", "both"):
        measure_padded(quick=args.quick)
    if args.case in ("distinct", "both"):
        measure_distinct(quick=args.quick)
    return 0


def serve(url: str) -> tuple[subprocess.Popen[bytes], int]:
    """``tuner serve`` over ``url``, one process; the access log off (memory is measured,
    and its lines would fill the terminal)."""
    port = free_port()
    env = {**os.environ, "TUNER_DATABASE_URL": url}
    command = [sys.executable, "-m", "tuner.cli", "serve", "--port", str(port), "--no-access-log"]
    return start(command, port, env, "/healthz"), port


def measure_padded(*, quick: bool) -> None:
    total, every = (2_000, 500) if quick else (10_000, 1_000)
    workdir = Path(tempfile.mkdtemp(prefix="tuner-bench-"))
    url = f"sqlite:///{workdir / 'tuner.db'}"
    token, paths = fill_store(url, workloads=10, devices=2, history=1)
    server, port = serve(url)
    limit = ServiceSettings().max_target_bytes
    # The longest query string taken: the whole target within the limit.
    within = limit - len(paths[0].partition("?")[0]) - 1
    try:
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60
        ) as client:
            started = time.perf_counter()
            taken, taken_statuses = ask_padded(
                client, server.pid, paths[0], total=total, every=every, length=within
            )
            refused, refused_statuses = ask_padded(
                client, server.pid, paths[0], total=total // 2, every=every, length=63_000
            )
            seconds = time.perf_counter() - started
    finally:
        server.terminate()
        server.wait(timeout=30)
    rows = [[*taken[0], ""], *([*row, "200"] for row in taken[1:])]
    rows += [[f"+{row[0]}", row[1], "414"] for row in refused[1:]]
    body = "\n\n".join(
        [
            "## Service memory under one question respelled (`bench/service_memory.py`)",
            f"Machine: {machine_line()}. `tuner serve`, one process, SQLite, the access log "
            f"off; one recommendation question asked {total:,} times with its query string "
            f"padded with `&` to {within:,} bytes (the whole target within the service's "
            f"{limit:,}-byte limit), the padding split differently each time, then "
            f"{total // 2:,} times padded to 63,000 bytes; 4 client threads ({seconds:.0f} s). "
            f"Statuses: {_counts(taken_statuses)} within the limit, "
            f"{_counts(refused_statuses)} past it. No answer is kept per question or per "
            "spelling (an earlier cache keyed by spelling grew ~60 KiB a request at 63,000 "
            "bytes: 127 to 402 MiB over 4,660 requests).",
            transposed_table(["requests", "server RSS (MiB)", "status"], rows),
        ]
    )
    print()
    print(body)
    if not quick:
        write_section("service-memory-padded", body)


def _counts(statuses: dict[int, int]) -> str:
    return ", ".join(f"{count:,} × {status}" for status, count in sorted(statuses.items()))


def measure_distinct(*, quick: bool) -> None:
    total, every = (4_000, 1_000) if quick else (100_000, 10_000)
    workdir = Path(tempfile.mkdtemp(prefix="tuner-bench-"))
    url = f"sqlite:///{workdir / 'tuner.db'}"
    token, paths = fill_store(url, workloads=100, devices=10, history=1)
    server, port = serve(url)
    rows = []
    try:
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers) as client:
            asked = iter(questions(paths))
            rows.append(["0", f"{resident_mib(server.pid):.0f}"])
            started = time.perf_counter()
            with ThreadPoolExecutor(4) as pool:
                for done in range(every, total + 1, every):
                    batch = [next(asked) for _ in range(every)]
                    statuses = list(pool.map(lambda p: client.get(p).status_code, batch))
                    assert all(s in (200, 409) for s in statuses), set(statuses)
                    rows.append([f"{done:,}", f"{resident_mib(server.pid):.0f}"])
                    print("  ".join(rows[-1]), flush=True)
            seconds = time.perf_counter() - started
    finally:
        server.terminate()
        server.wait(timeout=30)
    body = "\n\n".join(
        [
            "## Service memory under distinct questions (`bench/service_memory.py`)",
            f"Machine: {machine_line()}. `tuner serve`, one process, SQLite with 1,000 "
            f"profiles; {total:,} recommendation questions, all different, 4 client "
            f"threads ({seconds:.0f} s). No answer is kept in the process; token checks "
            f"are, at most {GenerationCache().max_entries:,} (least recently used go first).",
            transposed_table(["questions asked", "server RSS (MiB)"], rows),
        ]
    )
    print()
    print(body)
    if not quick:
        write_section("service-memory", body)


if __name__ == "__main__":
    sys.exit(main())
