"""The service's memory under 100,000 distinct recommendation questions.

Every answer is kept in the process under the store's generation (``api.cache``); a
cache that grew with every new question would let a client that never repeats itself
grow the server without bound. This asks ``tuner serve`` (one process, SQLite) 100,000
questions that are all different (workload, device, global batch size, world size and
policy), and records the server's resident memory (``VmRSS``) as it goes, with how many
answers the cache holds at most.

Run: ``python bench/service_memory.py``, or ``--quick`` for a smoke run that writes
nothing.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from api.cache import GenerationCache
from bench.common import machine_line, markdown_table, write_section
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="service memory under distinct questions")
    parser.add_argument("--quick", action="store_true", help="small smoke run; writes nothing")
    args = parser.parse_args(argv)
    total, every = (4_000, 1_000) if args.quick else (100_000, 10_000)
    workdir = Path(tempfile.mkdtemp(prefix="tuner-bench-"))
    url = f"sqlite:///{workdir / 'tuner.db'}"
    token, paths = fill_store(url, workloads=100, devices=10, history=1)
    port = free_port()
    env = {**os.environ, "TUNER_DATABASE_URL": url}
    server = start(
        [sys.executable, "-m", "tuner.cli", "serve", "--port", str(port)], port, env, "/healthz"
    )
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
            f"threads ({seconds:.0f} s). The answer cache keeps at most "
            f"{GenerationCache().max_entries:,} answers (least recently used go first).",
            markdown_table(["questions asked", "server RSS (MiB)"], rows),
        ]
    )
    print()
    print(body)
    if not args.quick:
        write_section("service-memory", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
