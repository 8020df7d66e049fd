"""Overhead of the accumulating loop against a hand-written accumulation loop.

Both train the same example workloads with the same micro batches, on the CPU. Each
round runs one step of each, the first of the two alternating, so that drift in the
machine's speed hits both alike. The overhead is the median over rounds of the paired
ratio ``accumulator step time / hand-written step time − 1``.

Run: ``python bench/accumulate.py`` (a few minutes), or ``--quick`` for a smoke run that
writes nothing.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine_line, markdown_table, write_section
from tuner.core.plan import balanced_split, format_split
from tuner.engine.batching import Batch, batch_size_of, slice_batch
from tuner.engine.workload import Workload, load_workload
from tuner.train.accumulate import Accumulator


@dataclass(frozen=True)
class Case:
    label: str
    target: str
    options: dict[str, object]
    batch: int
    micro: int


CASES = [
    Case("mlp", "examples.mlp:workload", {}, 512, 128),
    Case("cnn", "examples.cnn:workload", {"width": 16}, 64, 16),
    Case("gpt", "examples.gpt:workload", {}, 32, 8),
    Case("gpt uneven", "examples.gpt:workload", {}, 30, 8),
]
QUICK_CASES = [Case("mlp", "examples.mlp:workload", {"hidden": 64}, 64, 16)]


def hand_written_step(
    workload: Workload,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    split: list[int],
) -> None:
    """The loop people write by hand: slice, weight by units, backward, one step."""
    starts = [0, *itertools.accumulate(split)]
    parts = [slice_batch(batch, starts[i], starts[i + 1]) for i in range(len(split))]
    count = workload.loss_units or batch_size_of
    units = [count(part) for part in parts]
    total = sum(units)
    optimizer.zero_grad(set_to_none=True)
    for part, part_units in zip(parts, units, strict=True):
        loss = workload.loss_fn(model, part) * (part_units / total)
        loss.backward()
    optimizer.step()


def timed(step: Callable[[], object]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


WARMUP_ROUNDS = 5


def run_case(case: Case, rounds: int) -> tuple[float, float, float]:
    """Median samples/s of each, and the median over rounds of the paired overhead."""
    workload = load_workload(case.target, case.options)
    batch = workload.make_batch(case.batch)
    split = balanced_split(case.batch, case.micro)  # the same micro batches for both
    model_a = copy.deepcopy(workload.model)
    model_b = copy.deepcopy(workload.model)
    optimizer_a = torch.optim.AdamW(model_a.parameters(), lr=1e-4)
    optimizer_b = torch.optim.AdamW(model_b.parameters(), lr=1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the BatchNorm notice: known, not news here
        accumulator = Accumulator(
            model_a,
            optimizer_a,
            micro_batch_size=case.micro,
            loss_fn=workload.loss_fn,
            loss_units=workload.loss_units,
            split=split,
        )
    ours, theirs, ratios = [], [], []
    for index in range(rounds + WARMUP_ROUNDS):
        runs = [
            lambda: accumulator.step(batch),
            lambda: hand_written_step(workload, model_b, optimizer_b, batch, split),
        ]
        # Alternate which goes first, so that neither always follows the other's frees.
        times = [timed(run) for run in (runs if index % 2 == 0 else runs[::-1])]
        ours_s, theirs_s = times if index % 2 == 0 else times[::-1]
        if index >= WARMUP_ROUNDS:  # first rounds allocate optimizer state, warm caches
            ours.append(case.batch / ours_s)
            theirs.append(case.batch / theirs_s)
            ratios.append(ours_s / theirs_s - 1)
    return statistics.median(ours), statistics.median(theirs), statistics.median(ratios)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="accumulating loop vs a hand-written loop")
    parser.add_argument("--quick", action="store_true", help="small smoke run; writes nothing")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args(argv)
    cases = QUICK_CASES if args.quick else CASES
    rounds = 3 if args.quick else args.rounds
    torch.manual_seed(0)
    rows = []
    for case in cases:
        ours, theirs, overhead = run_case(case, rounds)
        rows.append(
            [
                case.label,
                f"{case.batch} = {format_split(balanced_split(case.batch, case.micro))}",
                f"{theirs:,.0f}",
                f"{ours:,.0f}",
                f"{overhead:+.1%}",
            ]
        )
        print("  ".join(rows[-1]), flush=True)
    body = "\n\n".join(
        [
            "## Accumulating loop overhead (`bench/accumulate.py`)",
            f"Machine: {machine_line()}. AdamW, CPU, fp32; median samples/s over {rounds} "
            f"rounds after {WARMUP_ROUNDS} warm-up rounds; each round runs one step of each "
            "loop, the first of the two alternating.",
            markdown_table(
                [
                    "workload",
                    "batch = micro batches",
                    "hand-written samples/s",
                    "Accumulator samples/s",
                    "overhead",
                ],
                rows,
            ),
            "Overhead is the median over rounds of `Accumulator step time / hand-written "
            "step time − 1`, paired within each round so that drift in the machine's speed "
            "cancels; negative means the accumulator was faster (noise). Target: at most 2%.",
        ]
    )
    print()
    print(body)
    if not args.quick:
        write_section("accumulate", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
