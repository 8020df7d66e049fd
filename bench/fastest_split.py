"""Is the default answer the split that trains fastest? And what does timing cost?

Profiles the Quickstart's GPT (``examples.gpt:workload``) on the CPU backend at a memory
limit for a global batch ``B``, twice: with the speed curve (the default) and with
``--no-time-splits`` (the fewest micro batches). Then times every balanced split of ``B``
that fits, side by side as training runs them: one accumulating optimizer step per split,
in ``--rounds`` interleaved rounds, the median of each (after one warm-up step each). It
reports the answer's speed as a fraction of the fastest split's, and the profile's
seconds with and without the timing.

    python -m bench.fastest_split [--memory-limit 512MiB] [--global-batch-size 256]
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.common import machine_line, markdown_table, write_section
from tuner.answer.local import answer_from
from tuner.core.plan import balanced_runs, expand, format_runs, split_runs
from tuner.core.units import parse_bytes
from tuner.engine.backends import CpuBackend
from tuner.engine.probe import Prober
from tuner.engine.profiler import profile_workload
from tuner.engine.workload import load_workload

TARGET = "examples.gpt:workload"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory-limit", default="512MiB")
    parser.add_argument("--global-batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    limit, batch = parse_bytes(args.memory_limit), args.global_batch_size

    started = time.perf_counter()
    timed = profile_workload(load_workload(TARGET), CpuBackend(limit), per_rank_batch_size=batch)
    with_timing_s = time.perf_counter() - started
    started = time.perf_counter()
    untimed = profile_workload(load_workload(TARGET), CpuBackend(limit), time_speeds=False)
    without_timing_s = time.perf_counter() - started
    answer = answer_from(timed, global_batch_size=batch)
    fewest = answer_from(untimed, global_batch_size=batch)
    m_star = timed.max_micro_batch_size
    print(f"M* {m_star} (untimed profile: {untimed.max_micro_batch_size})")
    print(f"answer: {format_runs(answer.split)} ({answer.reason})")
    print(f"profile {with_timing_s:.1f} s with timing, {without_timing_s:.1f} s without")

    # The splits the issue timed: the fewest balanced (k₀ = ⌈B / M*⌉ micro batches), one
    # more, 2, 4 and 8 times as many, and max's M* first with the remainder last.
    fewest_steps = -(-batch // m_star)
    splits = []
    for steps in (fewest_steps, fewest_steps + 1, *(fewest_steps * j for j in (2, 4, 8))):
        runs = balanced_runs(batch, -(-batch // steps)) if steps <= batch else None
        if runs is not None and runs not in splits:
            splits.append(runs)
    largest_first = split_runs(batch, m_star)
    if largest_first not in splits:
        splits.append(largest_first)
    speeds: dict[int, list[float]] = {i: [] for i in range(len(splits))}
    backend = CpuBackend(limit)
    with backend.session(), Prober(load_workload(TARGET), backend) as prober:
        for _ in range(args.rounds):
            for index, runs in enumerate(splits):
                speeds[index].append(batch / prober.time_split(expand(runs), steps=1))
    medians = {i: statistics.median(v) for i, v in speeds.items()}
    best = max(medians, key=medians.__getitem__)
    chosen = splits.index(answer.split) if answer.split in splits else None
    rows = []
    for index, runs in enumerate(splits):
        spread = 1 - min(speeds[index]) / max(speeds[index])
        marks = [m for m, i in (("answer", chosen), ("fastest", best)) if i == index]
        if runs == fewest.split:
            marks.append("fewest")
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
    share = medians[chosen] / medians[best] if chosen is not None else float("nan")
    summary = (
        f"The answer, {format_runs(answer.split)}, trains at {share:.1%} of the fastest split "
        f"timed side by side ({format_runs(splits[best])}); the fewest micro batches, "
        f"{format_runs(fewest.split)}, at "
        f"{medians[splits.index(fewest.split)] / medians[best]:.1%}. Profiling took "
        f"{with_timing_s:.1f} s with the timing and {without_timing_s:.1f} s without "
        f"(M* = {m_star}; {len(timed.speeds.sizes) if timed.speeds else 0} sizes timed, "
        "3 rounds each and one warm-up)."
    )
    print(summary)
    if not args.no_write:
        body = "\n\n".join(
            [f"Machine: {machine_line()}. The answer's reason: {answer.reason}.", table, summary]
        )
        write_section("fastest-split", "## The plan that trains fastest\n\n" + body)


if __name__ == "__main__":
    main()
