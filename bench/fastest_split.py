"""Is the default answer the split that trains fastest? Never slower than the fewest under
load? And what does timing cost?

Profiles the Quickstart's GPT (``examples.gpt:workload``) on the CPU backend at a memory
limit for a global batch ``B``, twice: with the speed curve (the default) and with
``--no-time-splits`` (the fewest micro batches). Then times every balanced split of ``B``
that fits, side by side as training runs them: one accumulating optimizer step per split,
in ``--rounds`` interleaved rounds, the median of each (after one warm-up step each). It
reports the answer's speed as a fraction of the fastest split's and of the fewest's, and
the profile's seconds with and without the timing.

It does so quiet, then loaded: ``--load`` processes spinning on the CPU (by default one a
core) while the profile times its splits, as on a busy machine; the side-by-side timing
that judges the answer runs quiet again.

    python -m bench.fastest_split [--memory-limit 512MiB] [--global-batch-size 256] [--load N]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script

from bench.common import machine_line, markdown_table, write_section
from tuner.answer.local import answer_from
from tuner.core.plan import Run, balanced_runs, expand, format_runs, split_runs
from tuner.core.units import parse_bytes
from tuner.engine.backends import CpuBackend
from tuner.engine.probe import Prober
from tuner.engine.profiler import profile_workload
from tuner.engine.workload import load_workload

TARGET = "examples.gpt:workload"


def _spin(parent: int) -> None:
    """Keep a core busy until the parent process is gone (a killed benchmark leaves no
    spinner behind)."""
    while os.getppid() == parent:
        for _ in range(1_000_000):
            pass


@contextmanager
def load(processes: int) -> Iterator[None]:
    """``processes`` processes that keep a core each busy, for as long as the block runs."""
    spinners = [
        multiprocessing.Process(target=_spin, args=(os.getpid(),), daemon=True)
        for _ in range(processes)
    ]
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.terminate()
            spinner.join()


@dataclass(frozen=True)
class Answered:
    split: list[Run]
    reason: str
    seconds: float


def answer(limit: int, batch: int, processes: int) -> tuple[Answered, int]:
    """The default answer from a profile timed under ``processes`` spinning processes."""
    with load(processes):
        started = time.perf_counter()
        timed = profile_workload(
            load_workload(TARGET), CpuBackend(limit), per_rank_batch_size=batch
        )
        seconds = time.perf_counter() - started
    found = answer_from(timed, global_batch_size=batch)
    return Answered(found.split, found.reason, seconds), timed.max_micro_batch_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory-limit", default="512MiB")
    parser.add_argument("--global-batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--load", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    limit, batch = parse_bytes(args.memory_limit), args.global_batch_size

    quiet, m_star = answer(limit, batch, 0)
    loaded, loaded_m_star = answer(limit, batch, args.load)
    started = time.perf_counter()
    untimed = profile_workload(load_workload(TARGET), CpuBackend(limit), time_speeds=False)
    without_timing_s = time.perf_counter() - started
    fewest = answer_from(untimed, global_batch_size=batch).split
    print(f"M* {m_star} (loaded: {loaded_m_star}; untimed profile: {untimed.max_micro_batch_size})")
    for name, found in (("quiet", quiet), ("loaded", loaded)):
        print(f"{name}: {format_runs(found.split)} ({found.reason}), {found.seconds:.1f} s")

    # The fewest balanced (k₀ = ⌈B / M*⌉ micro batches), one more, 2, 4 and 8 times as
    # many, max's M* first with the remainder last, and the answers.
    fewest_steps = -(-batch // m_star)
    splits: list[list[Run]] = []
    for steps in (fewest_steps, fewest_steps + 1, *(fewest_steps * j for j in (2, 4, 8))):
        runs = balanced_runs(batch, -(-batch // steps)) if steps <= batch else None
        if runs is not None and runs not in splits:
            splits.append(runs)
    for runs in (split_runs(batch, m_star), fewest, quiet.split, loaded.split):
        if runs not in splits:
            splits.append(runs)
    speeds: dict[int, list[float]] = {i: [] for i in range(len(splits))}
    backend = CpuBackend(limit)
    with backend.session(), Prober(load_workload(TARGET), backend) as prober:
        for _ in range(args.rounds):
            for index, runs in enumerate(splits):
                speeds[index].append(batch / prober.time_split(expand(runs), steps=1))
    medians = {i: statistics.median(v) for i, v in speeds.items()}
    best = max(medians, key=medians.__getitem__)
    rows = []
    for index, runs in enumerate(splits):
        spread = 1 - min(speeds[index]) / max(speeds[index])
        marks = [
            name
            for name, at in (("quiet answer", quiet.split), ("loaded answer", loaded.split))
            if at == runs
        ]
        marks += ["fastest"] if index == best else []
        marks += ["fewest"] if runs == fewest else []
        rows.append(
            [
                format_runs(runs),
                f"{medians[index]:.1f}",
                f"{spread:.0%}",
                f"{medians[index] / medians[best]:.1%}",
                ", ".join(marks),
            ]
        )
    table = markdown_table(["split", "samples/s (median)", "spread", "of fastest", ""], rows)
    print(table)

    def share(runs: list[Run]) -> str:
        return f"{medians[splits.index(runs)] / medians[best]:.1%}"

    fewest_speed = medians[splits.index(fewest)]
    loaded_vs_fewest = medians[splits.index(loaded.split)] / fewest_speed
    summary = (
        f"Quiet, the answer {format_runs(quiet.split)} trains at {share(quiet.split)} of the "
        f"fastest split timed side by side ({format_runs(splits[best])}); under load "
        f"({args.load} processes spinning while the profile timed), "
        f"{format_runs(loaded.split)} at {share(loaded.split)} ({loaded_vs_fewest:.1%} of the "
        f"fewest's speed); the fewest micro batches, {format_runs(fewest)}, at "
        f"{share(fewest)}. Profiling took {quiet.seconds:.1f} s with the timing quiet, "
        f"{loaded.seconds:.1f} s loaded and {without_timing_s:.1f} s without (M* = {m_star})."
    )
    print(summary)
    if not args.no_write:
        body = "\n\n".join(
            [
                f"Machine: {machine_line()}. The quiet answer's reason: {quiet.reason}. "
                f"The loaded answer's: {loaded.reason}.",
                table,
                summary,
            ]
        )
        write_section("fastest-split", "## The plan that trains fastest\n\n" + body)


if __name__ == "__main__":
    main()
