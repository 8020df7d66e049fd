"""The recommendation endpoint under load, beside a bare FastAPI endpoint, in one run.

1. An SQLite store (or ``--database-url``) gets 100,000 profiles: 2,000 workloads × 10
   devices × 5 profiles of history, 3 probes each, inserted in bulk through the real
   schema. Two more devices have no profile, so some answers are estimates.
2. The service (``tuner serve --workers N``) and a bare FastAPI app (``uvicorn --workers
   N``) run side by side with the same settings, N = one per core by default.
3. ``wrk`` (one thread, 50 or 4 connections, loopback only) loads each for a bounded time:
   a 2-second warm-up, a 2-second run that measures the rate, then the measured run,
   which lasts as long as about 20,000 requests take (at most 2 minutes).
   - bare: ``GET /bare`` (``async def``, the fastest a FastAPI endpoint can be) and
     ``GET /bare-sync`` (a plain ``def``, run in FastAPI's threadpool), for reference.
   - cold: every request a workload and device pair not asked before, with its own batch,
     world size and policy; the store's generation is raised before each of the three
     runs, so no answer comes from a cache.
   - fleet: 200 questions asked over and over, as the jobs of a fleet do at start-up.
   Requests carry a read token. Latency percentiles and requests per second come from wrk.

With ``--against REF`` (a commit), the same loads also run, interleaved, against that
commit's service (a checkout of it, on a copy of the same store): the side-by-side figures.

Run: ``python bench/service.py`` (needs Debian's ``wrk``), or ``--quick`` for a smoke run
that writes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import httpx
from fastapi import FastAPI

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

bare_app = FastAPI()


@bare_app.get("/bare")
async def bare() -> dict[str, bool]:
    """The least an endpoint can do: the ceiling for any endpoint of this server."""
    return {"ok": True}


@bare_app.get("/bare-sync")
def bare_sync() -> dict[str, bool]:
    """The same as a plain ``def``: FastAPI runs it in its threadpool, a hop each way."""
    return {"ok": True}


BARE = "bare FastAPI `GET /bare` (`async def`)"
BARE_SYNC = "bare FastAPI `GET /bare-sync` (`def`, threadpool)"
COLD = "`GET /api/v1/recommendation`, cold: each a new pair, caches emptied"
FLEET = "`GET /api/v1/recommendation`, 200 repeated questions"
BARE_LIGHT = "bare FastAPI `GET /bare`, 4 connections"
COLD_LIGHT = "`GET /api/v1/recommendation`, cold, 4 connections"

_WRK_SCRIPT = r"""
local paths = {}
for line in io.lines(os.getenv("BENCH_PATHS")) do paths[#paths + 1] = line end
local token = os.getenv("BENCH_TOKEN")
local sent = 0
request = function()
  sent = sent + 1
  local headers = {}
  if token ~= "" then headers["Authorization"] = "Bearer " .. token end
  return wrk.format("GET", paths[(sent % #paths) + 1], headers)
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH {"requests": %d, "duration_us": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d, ' ..
    '"socket_errors": %d, "non_2xx": %d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), e.connect + e.read + e.write + e.timeout, e.status))
end
"""


@dataclass(frozen=True)
class Load:
    requests: int
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    errors: int


def fill_store(url: str, *, workloads: int, devices: int, history: int) -> tuple[str, list[str]]:
    """Bulk-insert profiles; return a read token and the recommendation paths to request."""
    from sqlalchemy import insert

    from api import migrate, models
    from api.db import Database
    from api.store.tokens import create_token

    migrate.upgrade(url)
    database = Database(url)
    rng = random.Random(0)
    base = datetime(2026, 1, 1, tzinfo=UTC)
    device_keys = [f"bench-device-{d:03d}" for d in range(devices + 2)]
    workload_keys = [f"bench-workload-{w:05d}" for w in range(workloads)]
    with database.session(write=True) as session:
        session.execute(
            insert(models.Device),
            [
                {
                    "id": d + 1,
                    "key": key,
                    "kind": "cuda",
                    "name": f"Bench GPU {d}",
                    "capacity_bytes": (40 + 8 * d) * 2**30,
                    "details": {},
                    "created_at": base,
                }
                for d, key in enumerate(device_keys)
            ],
        )
        session.execute(
            insert(models.Workload),
            [
                {
                    "id": w + 1,
                    "key": key,
                    "name": f"bench-{w}",
                    "target": "examples.gpt:workload",
                    "precision": "bf16",
                    "activation_checkpointing": False,
                    "parameter_count": 10**8,
                    "optimizer": "AdamW",
                    "created_at": base,
                }
                for w, key in enumerate(workload_keys)
            ],
        )
        profile_id = 0
        profiles: list[dict[str, object]] = []
        probes: list[dict[str, object]] = []
        for w in range(workloads):
            for d in range(devices):
                for h in range(history):
                    profile_id += 1
                    found = rng.randint(1, 512)
                    fixed, slope = 10 * 2**30, 64 * 2**20
                    profiles.append(
                        {
                            "id": profile_id,
                            "workload_id": w + 1,
                            "device_id": d + 1,
                            "created_at": base + timedelta(days=h, seconds=profile_id),
                            "headroom": 0.05,
                            "budget_bytes": fixed + slope * found,
                            "strategy": "model",
                            "size_cap": 4096,
                            "max_micro_batch_size": found,
                            "fit_fixed_bytes": float(fixed),
                            "fit_bytes_per_sample": float(slope),
                            "fit_points": 3,
                            "settings": {
                                "warmup_steps": 2,
                                "measure_steps": 1,
                                "microbatches_per_step": 2,
                            },
                            "oversize_probe": None,
                            "wall_time_s": 30.0,
                        }
                    )
                    for ordinal, size in enumerate((1, found, found + 1)):
                        peak = fixed + slope * size
                        probes.append(
                            {
                                "profile_id": profile_id,
                                "ordinal": ordinal,
                                "micro_batch_size": size,
                                "fits": size <= found,
                                "oom": False,
                                "peak_allocated_bytes": peak,
                                "peak_reserved_bytes": peak,
                                "non_torch_bytes": 0,
                                "alloc_retries": 0,
                                "phase_peaks_bytes": {},
                                "breakdown": None,
                                "step_time_s": 0.01 * size + 0.05,
                                "samples_per_second": 2 * size / (0.01 * size + 0.05),
                                "steps_run": 4,
                                "wall_time_s": 1.0,
                                "error": None,
                            }
                        )
            if len(profiles) >= 20_000:
                session.execute(insert(models.Profile), profiles)
                session.execute(insert(models.Probe), probes)
                profiles, probes = [], []
        if profiles:
            session.execute(insert(models.Profile), profiles)
            session.execute(insert(models.Probe), probes)
        _, token = create_token(session, name="bench", scopes=["read"])
    database.dispose()
    # Cold questions: every pair of workload and device once, in random order, each with
    # its own batch, world size and policy; the last two devices have no profile, so
    # their answers are estimates.
    pairs = [(w, d) for w in workload_keys for d in device_keys]
    rng.shuffle(pairs)
    paths = []
    for workload, device in pairs:
        world = rng.choice([1, 2, 4, 8])
        batch = world * rng.randint(1, 256)
        policy = rng.choice(["max", "max", "even", "throughput"])
        paths.append(
            f"/api/v1/recommendation?workload={workload}&device={device}"
            f"&global_batch_size={batch}&world_size={world}&policy={policy}"
        )
    return token, paths


def forget_answers(url: str) -> None:
    """Raise the store's generation, as any write does: every cached answer is void."""
    from api.db import Database
    from api.store.generation import mark_changed

    database = Database(url)
    with database.session(write=True) as session:
        mark_changed(session)
    database.dispose()


def start(
    command: list[str], port: int, env: dict[str, str], probe_path: str, *, cwd: Path = ROOT
) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}{probe_path}", timeout=2)
            return process
        except httpx.TransportError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{command} did not start") from None
            time.sleep(0.2)


def run_wrk(
    url: str,
    paths: list[str],
    requests: int,
    token: str,
    workdir: Path,
    connections: int,
    before: Callable[[], None],
) -> Load:
    """About ``requests`` requests after a warm-up: wrk bounds a run by time, so the rate is
    measured first. ``before`` runs before each of the three."""
    before()
    _wrk(url, paths, 2.0, token, workdir, connections)
    before()
    rate = _wrk(url, paths, 2.0, token, workdir, connections).rps
    seconds = min(120.0, max(1.0, requests / rate))
    before()
    return _wrk(url, paths, seconds, token, workdir, connections)


def _wrk(
    url: str, paths: list[str], seconds: float, token: str, workdir: Path, connections: int = 50
) -> Load:
    script = workdir / "bench.lua"
    script.write_text(_WRK_SCRIPT)
    paths_file = workdir / "paths.txt"
    paths_file.write_text("\n".join(paths) + "\n")
    env = {**os.environ, "BENCH_PATHS": str(paths_file), "BENCH_TOKEN": token}
    output = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            "--latency",
            "-s",
            str(script),
            url,
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    line = next(line for line in output.splitlines() if line.startswith("BENCH "))
    data = json.loads(line.removeprefix("BENCH "))
    return Load(
        requests=data["requests"],
        rps=data["requests"] / (data["duration_us"] / 1e6),
        p50_ms=data["p50_us"] / 1000,
        p90_ms=data["p90_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        errors=data["socket_errors"] + data["non_2xx"],
    )


def main(argv: list[str] | None = None) -> int:
    from bench.common import machine_line, markdown_table, write_section
    from tests.services import free_port

    parser = argparse.ArgumentParser(description="recommendation endpoint under load")
    parser.add_argument("--quick", action="store_true", help="small smoke run; writes nothing")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--database-url", default=None, help="default: a new SQLite file")
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="processes for each server (default: one per core)",
    )
    parser.add_argument(
        "--against",
        default=None,
        metavar="REF",
        help="also load the service of this commit (SQLite only), side by side",
    )
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        parser.error("wrk is not installed: apt-get install wrk")
    workloads, requests = (100, 2000) if args.quick else (2000, args.requests)
    workdir = Path(tempfile.mkdtemp(prefix="tuner-bench-"))
    url = args.database_url or f"sqlite:///{workdir / 'tuner.db'}"
    started = time.perf_counter()
    token, paths = fill_store(url, workloads=workloads, devices=10, history=5)
    stored = workloads * 10 * 5
    print(f"stored {stored:,} profiles in {time.perf_counter() - started:.0f} s", flush=True)

    env = {**os.environ, "TUNER_DATABASE_URL": url}
    service_port, bare_port = free_port(), free_port()
    workers = ["--workers", str(args.workers)]
    uvicorn_common = ["--host", "127.0.0.1", "--log-level", "warning", "--no-access-log"]
    # Copied before this commit's service opens the store, so the copy is whole.
    against = None
    if args.against is not None:
        if not url.startswith("sqlite:///"):
            parser.error("--against copies the store, which needs SQLite")
        against = start_against(args.against, url, workdir, [*workers])
    service = start(
        [sys.executable, "-m", "tuner.cli", "serve", "--port", str(service_port), *workers],
        service_port,
        env,
        "/healthz",
    )
    bare_server = start(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "bench.service:bare_app",
            "--port",
            str(bare_port),
            *uvicorn_common,
            *workers,
        ],
        bare_port,
        env,
        "/bare",
    )
    try:
        results: dict[str, Load] = {}
        # A fleet: many jobs of the same workloads ask the same few hundred questions.
        fleet = paths[:200]
        cold = partial(forget_answers, url)
        runs: list[tuple[str, int, list[str], str, int, Callable[[], None]]] = [
            (BARE, bare_port, ["/bare"], "", 50, _nothing),
            (BARE_SYNC, bare_port, ["/bare-sync"], "", 50, _nothing),
            (COLD, service_port, paths, token, 50, cold),
            (FLEET, service_port, fleet, token, 50, _nothing),
            (BARE_LIGHT, bare_port, ["/bare"], "", 4, _nothing),
            (COLD_LIGHT, service_port, paths, token, 4, cold),
        ]
        if against is not None:
            old_cold = partial(forget_answers, against.url)
            ref = f" at {args.against}"
            runs[3:3] = [(COLD + ref, against.port, paths, token, 50, old_cold)]
            runs[5:5] = [(FLEET + ref, against.port, fleet, token, 50, _nothing)]
            runs.append((COLD_LIGHT + ref, against.port, paths, token, 4, old_cold))
        for name, port, target_paths, auth, connections, before in runs:
            base = f"http://127.0.0.1:{port}"
            load = run_wrk(base, target_paths, requests, auth, workdir, connections, before)
            results[name] = load
            print(
                f"{name}: {load.rps:,.0f} req/s, p50 {load.p50_ms:.1f} ms, "
                f"p99 {load.p99_ms:.1f} ms, errors {load.errors}",
                flush=True,
            )
    finally:
        for process in (service, bare_server, *([against.process] if against else [])):
            process.terminate()
            process.wait(timeout=10)
        if against is not None:
            against.remove()
        shutil.rmtree(workdir, ignore_errors=True)

    rows = [
        [
            name,
            f"{r.requests:,}",
            f"{r.rps:,.0f}",
            f"{r.p50_ms:.1f}",
            f"{r.p90_ms:.1f}",
            f"{r.p99_ms:.1f}",
            str(r.errors),
        ]
        for name, r in results.items()
    ]
    bare_load, cold_load, fleet_load = results[BARE], results[COLD], results[FLEET]
    sync_load = results[BARE_SYNC]

    def verdict(load: Load, baseline: Load) -> str:
        share = load.rps / baseline.rps
        met = share >= 0.5 and load.p99_ms <= 20 and load.errors == 0
        outcome = "met" if met else "not met"
        return f"{share:.0%} of its throughput, p99 {load.p99_ms:.1f} ms: {outcome}"

    side_by_side = []
    if args.against is not None:
        light = results[COLD_LIGHT]
        side_by_side.append(
            f"Side by side with {args.against} (its own checkout, a copy of the same store, "
            "loads interleaved): a new question's p99 over 4 connections "
            f"{light.p99_ms:.1f} ms here against "
            f"{results[COLD_LIGHT + ' at ' + args.against].p99_ms:.1f} ms there (target "
            f"≤ 10 ms: {'met' if light.p99_ms <= 10 else 'not met'}), over 50 "
            f"{cold_load.p99_ms:.1f} ms against "
            f"{results[COLD + ' at ' + args.against].p99_ms:.1f} ms (target ≤ 50 ms: "
            f"{'met' if cold_load.p99_ms <= 50 else 'not met'})."
        )
    body = "\n\n".join(
        [
            "## Recommendation service under load (`bench/service.py`)",
            f"Machine: {machine_line()}. {stored:,} stored profiles "
            f"({'SQLite' if url.startswith('sqlite') else 'PostgreSQL'}); "
            f"{_processes(args.workers)} for each server (`tuner serve --workers "
            f"{args.workers}`, `uvicorn --workers {args.workers}`); wrk with 1 thread on "
            "loopback, about "
            f"{requests:,} requests after a 2-second warm-up and a 2-second rate check.",
            markdown_table(
                ["endpoint", "requests", "req/s", "p50 ms", "p90 ms", "p99 ms", "errors"], rows
            ),
            "Target: at least half the bare endpoint's throughput and p99 at most 20 ms. "
            "Against the bare `async def` endpoint (the fastest a FastAPI endpoint can be): "
            f"fleet {verdict(fleet_load, bare_load)}; cold {verdict(cold_load, bare_load)}. "
            "Against the bare `def` endpoint (the usual way to write one): fleet "
            f"{verdict(fleet_load, sync_load)}; cold {verdict(cold_load, sync_load)}.",
            *side_by_side,
            "Cold: every request asks about a workload and device pair not asked before in "
            "the run, and the store's generation is raised before each run, so no answer "
            "comes from a cache. Fleet: 200 questions asked over and over. The service "
            "answers each in a worker thread, at most `api.service.ANSWERS_AT_ONCE` at once "
            "per process (the rest wait their turn, off the event loop): the store reads the "
            "project's evidence (`api/store/evidence.py`) and `tuner.answer.decide` answers.",
        ]
    )
    print()
    print(body)
    if not args.quick:
        write_section("service", body)
    return 0


@dataclass
class Against:
    """The service of another commit, from its own checkout, over a copy of the store."""

    checkout: Path
    url: str
    port: int
    process: subprocess.Popen[bytes]

    def remove(self) -> None:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(self.checkout)], cwd=ROOT, check=False
        )


def start_against(ref: str, url: str, workdir: Path, workers: list[str]) -> Against:
    """Check ``ref`` out beside this one, copy the store for it (stamped with its own
    newest migration, which the columns it reads are in), and start its service."""
    from tests.services import free_port

    checkout = workdir / "against"
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(checkout), ref],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    head = subprocess.run(
        [sys.executable, "-c", "from api.migrate import head_revision; print(head_revision())"],
        cwd=checkout,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    source = Path(url.removeprefix("sqlite:///"))
    copy = workdir / "against.db"
    shutil.copy(source, copy)
    with sqlite3.connect(copy) as connection:
        connection.execute("UPDATE alembic_version SET version_num = ?", (head,))
    copy_url = f"sqlite:///{copy}"
    port = free_port()
    process = start(
        [sys.executable, "-m", "tuner.cli", "serve", "--port", str(port), *workers],
        port,
        {**env, "TUNER_DATABASE_URL": copy_url},
        "/healthz",
        cwd=checkout,
    )
    return Against(checkout, copy_url, port, process)


def _processes(count: int) -> str:
    return "one uvicorn process" if count == 1 else f"{count} uvicorn processes"


def _nothing() -> None:
    pass


if __name__ == "__main__":
    sys.exit(main())
