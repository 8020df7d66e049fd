"""What locating the peak costs a probe: per-block saved activations and the phase of the
peak, recorded in the measured step, against the same probe without them.

Each round probes the same size twice, with and without locating, the first of the two
alternating so that drift in the machine's speed hits both alike; one torch thread, CPU
time of the whole probe (warm-up, measured and timed steps, as the search pays it). The
overhead is the median over rounds of the paired ratio ``located / plain − 1``.

Run: ``python bench/peak.py`` (about a minute), or ``--quick`` for a smoke run that writes
nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine_line, markdown_table, write_section
from tuner.engine.backends import CpuBackend
from tuner.engine.probe import Prober
from tuner.engine.workload import load_workload

GiB = 2**30


@dataclass(frozen=True)
class Case:
    label: str
    target: str
    options: dict[str, object]
    size: int


CASES = [
    Case("mlp", "examples.mlp:workload", {}, 128),
    Case("cnn", "examples.cnn:workload", {"width": 16}, 16),
    Case("gpt", "examples.gpt:workload", {}, 10),
    Case("gpt, checkpointing", "examples.gpt:workload", {"checkpointing": True}, 10),
]
QUICK_CASES = [Case("mlp", "examples.mlp:workload", {"hidden": 64}, 16)]


def probe_seconds(case: Case, backend: CpuBackend, locate: bool) -> tuple[float, int]:
    """CPU seconds of one probe, and the bytes it filed under blocks (0 when not locating)."""
    workload = load_workload(case.target, case.options)
    with backend.session(), Prober(workload, backend, locate=locate) as prober:
        started = time.process_time()
        result = prober(case.size)
        seconds = time.process_time() - started
    assert result.breakdown is not None
    return seconds, sum(result.breakdown.activations_by_block_bytes.values())


def measure(case: Case, rounds: int) -> list[str]:
    backend = CpuBackend(4 * GiB)
    probe_seconds(case, backend, True)  # imports, first-call caches
    ratios, plain_times, located_times = [], [], []
    filed = 0
    for index in range(rounds):
        order = (False, True) if index % 2 == 0 else (True, False)
        times = {}
        for locate in order:
            times[locate], saved = probe_seconds(case, backend, locate)
            filed = max(filed, saved)
        plain_times.append(times[False])
        located_times.append(times[True])
        ratios.append(times[True] / times[False] - 1)
    return [
        case.label,
        str(case.size),
        f"{statistics.median(plain_times):.3f}",
        f"{statistics.median(located_times):.3f}",
        f"{100 * statistics.median(ratios):+.1f}%",
        f"{100 * (max(ratios) - min(ratios)) / 2:.1f}%",
        f"{filed / 2**20:.1f} MiB",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="one small case, writes nothing")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cases = QUICK_CASES if args.quick else CASES
    rounds = 2 if args.quick else args.rounds
    header = [
        "workload",
        "micro batch",
        "plain CPU-s",
        "located CPU-s",
        "overhead",
        "± half-range",
        "filed under blocks",
    ]
    rows = [measure(case, rounds) for case in cases]
    table = markdown_table(header, rows)
    print(table)
    if args.quick:
        return
    write_section(
        "peak",
        "## Locating the peak in a probe (`bench/peak.py`)\n\n"
        f"{machine_line()}. One torch thread; CPU time of a whole probe (2 warm-up steps, "
        "the measured step, the timed step) with and without per-block saved activations "
        f"and the peak's phase; median of {rounds} paired rounds, order alternating.\n\n" + table,
    )


if __name__ == "__main__":
    main()
