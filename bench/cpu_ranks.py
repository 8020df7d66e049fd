"""CPU ranks under gloo: what the limit is checked with, against what the process held,
and one profile's M* run after run.

1. Per rank: two gloo ranks (127.0.0.1) of a parameter-heavy GPT under FSDP (gloo's
   all-gather temporaries weigh as much as a sample's activations) run steps at a few
   micro batch sizes. Each block of steps is counted three ways: the tracker (the step
   thread's tensors, what a GPU holds: ``peak_bytes``), the figure the limit is checked
   with (``process_bytes``) from the exact count (``process_count``) and from
   torch.profiler's events (the fallback where the exact count cannot be built), and what
   the process held (the exact count, read around the block). Also what gloo allocated
   on the step's thread inside collectives, and on its worker threads.
2. M*: the same 2-rank profile run ``--runs`` times (10 by default) at a limit picked to
   put the budget inside the timing window of the boundary size.

Run: ``python bench/cpu_ranks.py`` (about 10 minutes on 2 cores); ``--runs 3`` for a
shorter M* part, ``--skip-ranks`` / ``--skip-runs`` for one part. It prints; nothing is
written.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine_line, markdown_table
from tuner.core.parallel import Parallel
from tuner.core.units import format_bytes
from tuner.engine.launch import _free_port, profile_distributed

MiB = 2**20
TARGET = "examples.gpt:workload"
GPT = {"layers": 2, "dim": 128, "heads": 4, "vocab": 8192, "seq_len": 16}
SIZES = (1, 4, 16)
REPEATS = 3  # blocks per size and count: the process's peak moves with gloo's timing
# 43.43 MiB: 5% headroom leaves a budget of 43,264,990 B, 187,726 B above the peak of
# micro batch 17 (43,077,264 B), inside the 793,088 B a gathered block adds when gloo's
# worker lets go of it late.
LIMIT_BYTES = 45_542_095
RANK_TIMEOUT_S = 600


def count_rank(rank: int, world: int, port: int, out: str) -> None:
    """Each size: warm up, then ``REPEATS`` blocks of two steps per count."""
    from tuner.engine.backends import CpuBackend
    from tuner.engine.batching import to_device
    from tuner.engine.probe import Prober
    from tuner.engine.workload import load_workload

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    rows: list[dict[str, Any]] = []
    try:
        backend = CpuBackend(2**32, count_all_threads=True)
        exact = backend.process_count
        if exact is None:
            raise SystemExit("the exact count could not be built here")
        workload = load_workload(TARGET, dict(GPT))
        workload.parallel = Parallel(mode="fsdp")
        with backend.session(), Prober(workload, backend, headroom=0.0, rank=rank) as prober:
            for size in SIZES:
                prober(size)
                batch = to_device(workload.sample_batch(size, rank=rank), backend.device)
                for _ in range(REPEATS):
                    for count in ("exact", "profiler"):
                        backend.process_count = exact if count == "exact" else None
                        with exact.block() as held, backend.track(prober._resident(batch)) as r:
                            start = backend.current_bytes()
                            for _ in range(2):
                                prober._step(batch, None)
                        rows.append(
                            {
                                "size": size,
                                "count": count,
                                "gpu": r.reserved_bytes,
                                "limit_figure": r.process_bytes,
                                "held": start + held.peak_bytes,
                                "collective": held.collective_peak_bytes,
                                "other_threads": held.other_threads_peak_bytes,
                            }
                        )
                backend.process_count = exact
    finally:
        dist.destroy_process_group()
    torch.save(rows, Path(out) / f"rank{rank}.pt")


def ranks_part() -> str:
    with tempfile.TemporaryDirectory() as out:
        spawn = multiprocessing.get_context("spawn")
        port = _free_port()
        ranks = [spawn.Process(target=count_rank, args=(rank, 2, port, out)) for rank in (0, 1)]
        for process in ranks:
            process.start()
        deadline = time.monotonic() + RANK_TIMEOUT_S
        for process in ranks:
            process.join(max(0.0, deadline - time.monotonic()))
        if any(process.exitcode != 0 for process in ranks):
            for process in ranks:
                process.kill()
            raise SystemExit(f"a rank failed or ran past {RANK_TIMEOUT_S} s")
        per_rank = [torch.load(Path(out) / f"rank{rank}.pt") for rank in range(2)]
    table = []
    for rank, rows in enumerate(per_rank):
        for size in SIZES:
            for count in ("profiler", "exact"):
                chosen = [row for row in rows if row["size"] == size and row["count"] == count]
                figures = [row["limit_figure"] for row in chosen]
                held = [row["held"] for row in chosen]
                over = [(f - h) / h for f, h in zip(figures, held, strict=True)]
                table.append(
                    [
                        str(rank),
                        str(size),
                        count,
                        _spread(row["gpu"] for row in chosen),
                        _spread(held),
                        _spread(figures),
                        f"{min(over):+.1%} to {max(over):+.1%}",
                        _spread(row["collective"] for row in chosen),
                        _spread(row["other_threads"] for row in chosen),
                    ]
                )
    return markdown_table(
        [
            "rank",
            "micro batch",
            "count",
            "GPU-standing peak",
            "process held",
            "limit checked with",
            "over held",
            "gloo on the step thread",
            "gloo's worker threads",
        ],
        table,
    )


def _spread(values: Any) -> str:
    values = sorted(set(values))
    if len(values) == 1:
        return f"{values[0]:,}"
    return f"{values[0]:,} to {values[-1]:,}"


def runs_part(runs: int) -> str:
    lines = []
    found = []
    for run in range(runs):
        started = time.perf_counter()
        profile = profile_distributed(
            TARGET,
            options=GPT,
            device="cpu",
            memory_limit_bytes=LIMIT_BYTES,
            world_size=2,
            parallel=Parallel(mode="fsdp"),
            headroom=0.05,
            strategy="model",
            size_cap=4096,
        )
        found.append(profile.max_micro_batch_size)
        probes = ", ".join(
            f"{p.micro_batch_size}{'' if p.fits else '✗'} {format_bytes(p.footprint_bytes or 0)}"
            for p in profile.probes
        )
        line = (
            f"run {run + 1}: M* {profile.max_micro_batch_size} "
            f"({time.perf_counter() - started:.0f} s; {probes})"
        )
        print(line, flush=True)
        lines.append(line)
    counts = {m: found.count(m) for m in sorted(set(found))}
    summary = ", ".join(f"M* {m}: {n} of {runs}" for m, n in counts.items())
    return "\n".join([*lines, summary])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="profiles in the M* part")
    parser.add_argument("--skip-ranks", action="store_true", help="only the M* part")
    parser.add_argument("--skip-runs", action="store_true", help="only the per-rank part")
    args = parser.parse_args()
    print(f"Machine: {machine_line()}. {TARGET} {GPT}, FSDP on 2 gloo ranks.", flush=True)
    if not args.skip_ranks:
        print(ranks_part(), flush=True)
    if not args.skip_runs:
        print(f"M* at {LIMIT_BYTES:,} B a rank, 5% headroom, {args.runs} runs:", flush=True)
        print(runs_part(args.runs), flush=True)


if __name__ == "__main__":
    main()
