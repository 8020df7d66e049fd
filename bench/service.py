"""The recommendation endpoint under load, beside a bare FastAPI endpoint, in one run.

1. An SQLite store (or ``--database-url``) gets 100,000 profiles: 2,000 workloads × 10
   devices × 5 profiles of history, 3 probes each, inserted in bulk through the real
   schema. Two more devices have no profile, so some answers are estimates.
2. The service (``tuner serve``) and a bare FastAPI app run in their own uvicorn
   processes with the same settings.
3. ``wrk`` (one thread, 50 connections, loopback only) loads each for a bounded time:
   a 2-second run measures the rate, then the measured run lasts as long as about
   20,000 requests take (at most 2 minutes). Recommendations are spread over random
   workloads, devices, batch sizes, world sizes and policies, with a read token; the bare
   endpoint is ``GET /bare``. Latency percentiles and requests per second come from wrk.

Run: ``python bench/service.py`` (needs Debian's ``wrk``), or ``--quick`` for a smoke run
that writes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from fastapi import FastAPI

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

bare_app = FastAPI()


@bare_app.get("/bare")
def bare() -> dict[str, bool]:
    """The least an endpoint can do: the ceiling for any endpoint of this server."""
    return {"ok": True}


DISTINCT = "`GET /api/v1/recommendation`, distinct questions"
FLEET = "`GET /api/v1/recommendation`, 200 repeated questions"
BARE_LIGHT = "bare FastAPI `GET /bare`, 4 connections"
FLEET_LIGHT = "`GET /api/v1/recommendation`, 200 repeated questions, 4 connections"

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
    from api.security import create_token

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
    paths = []
    # Distinct questions: more than one run sends, so each request is (nearly) a new one.
    for _ in range(40_000):
        device = rng.choice(device_keys)  # the last two have no profile: estimated
        world = rng.choice([1, 2, 4, 8])
        batch = world * rng.randint(1, 256)
        policy = rng.choice(["max", "max", "even", "throughput"])
        paths.append(
            f"/api/v1/recommendation?workload={rng.choice(workload_keys)}&device={device}"
            f"&global_batch_size={batch}&world_size={world}&policy={policy}"
        )
    return token, paths


def start(
    command: list[str], port: int, env: dict[str, str], probe_path: str
) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
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
    url: str, paths: list[str], requests: int, token: str, workdir: Path, connections: int = 50
) -> Load:
    """About ``requests`` requests: wrk bounds a run by time, so the rate is measured first."""
    rate = _wrk(url, paths, 2.0, token, workdir, connections).rps
    seconds = min(120.0, max(1.0, requests / rate))
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
    uvicorn_common = ["--host", "127.0.0.1", "--log-level", "warning"]
    service = start(
        [sys.executable, "-m", "tuner.cli", "serve", "--port", str(service_port)],
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
        ],
        bare_port,
        env,
        "/bare",
    )
    try:
        results: dict[str, Load] = {}
        # A fleet: many jobs of the same workloads ask the same few hundred questions.
        fleet = paths[:200]
        runs = (
            ("bare FastAPI `GET /bare`", bare_port, ["/bare"], "", 50),
            (DISTINCT, service_port, paths, token, 50),
            (FLEET, service_port, fleet, token, 50),
            (BARE_LIGHT, bare_port, ["/bare"], "", 4),
            (FLEET_LIGHT, service_port, fleet, token, 4),
        )
        for name, port, target_paths, auth, connections in runs:
            base = f"http://127.0.0.1:{port}"
            _wrk(base, target_paths, 2.0, auth, workdir, connections)  # warm up
            load = run_wrk(base, target_paths, requests, auth, workdir, connections)
            results[name] = load
            print(
                f"{name}: {load.rps:,.0f} req/s, p50 {load.p50_ms:.1f} ms, "
                f"p99 {load.p99_ms:.1f} ms, errors {load.errors}",
                flush=True,
            )
    finally:
        for process in (service, bare_server):
            process.terminate()
            process.wait(timeout=10)
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
    bare_load, cold, warm = (
        results["bare FastAPI `GET /bare`"],
        results[DISTINCT],
        results[FLEET],
    )
    body = "\n\n".join(
        [
            "## Recommendation service under load (`bench/service.py`)",
            f"Machine: {machine_line()}. {stored:,} stored profiles "
            f"({'SQLite' if url.startswith('sqlite') else 'PostgreSQL'}); one uvicorn process "
            "per server; wrk with 1 thread and 50 connections on loopback, about "
            f"{requests:,} requests after a 2-second warm-up and a 2-second rate check.",
            markdown_table(
                ["endpoint", "requests", "req/s", "p50 ms", "p90 ms", "p99 ms", "errors"], rows
            ),
            f"Distinct questions (each computed afresh: 3 indexed queries and the plan) ran "
            f"at {cold.rps / bare_load.rps:.0%} of the bare endpoint's throughput, p99 "
            f"{cold.p99_ms:.1f} ms. Fleet-like repeats (200 questions, answered from the "
            f"cache while the store's generation is unchanged) ran at "
            f"{warm.rps / bare_load.rps:.0%}, p99 {warm.p99_ms:.1f} ms. Targets: at least "
            "50% and p99 at most 20 ms. Latency under 50 open connections is mostly "
            "queueing: at a given rate, mean latency is 50 / rate (Little's law), which is "
            "why even the bare endpoint's p99 is what it is. With 4 connections the "
            f"recommendation's p99 is {results[FLEET_LIGHT].p99_ms:.1f} ms (bare "
            f"{results[BARE_LIGHT].p99_ms:.1f} ms).",
        ]
    )
    print()
    print(body)
    if not args.quick:
        write_section("service", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
