"""How well profiles at three sequence lengths predict a length never measured.

Each case profiles a workload at three lengths (the model search, CPU backend with a
memory limit), fits ``peak(m, s) ≈ a₀ + a₁·s + b·m·s + c·m·s²`` through their probes
(:mod:`tuner.core.lengths`), estimates ``M*`` and its peak at held-out lengths (one
between the measured ones, one beyond the longest), then profiles those lengths too and
compares. Target: peak within 2%, ``M*`` exact or one below, never above.

Run: ``python bench/seqlen.py`` (a few minutes), or ``--quick`` for a smoke run that
writes nothing.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine_line, markdown_table, write_section
from tuner.core.lengths import estimate_length
from tuner.core.results import Profile
from tuner.core.units import format_bytes
from tuner.engine.backends import make_backend
from tuner.engine.profiler import profile_workload
from tuner.engine.workload import load_workload

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Case:
    label: str
    target: str
    options: dict[str, object]
    memory_limit: int
    measured: tuple[int, ...]
    held_out: tuple[int, ...]


MiB = 2**20
CASES = [
    Case(
        "gpt (SDPA attention)",
        "examples.gpt:workload",
        {"vocab": 512, "dim": 64, "layers": 2, "heads": 4, "seq_len": 512},
        96 * MiB,
        (64, 128, 256),
        (192, 320),
    ),
    Case(
        "llama (transformers, eager attention)",
        "tuner.hf:causal_lm",
        {"config": str(ROOT / "tests" / "data" / "tiny_llama.json")},
        64 * MiB,
        (32, 64, 128),
        (96, 160),
    ),
]
QUICK_CASES = [
    Case(
        "gpt",
        "examples.gpt:workload",
        {"vocab": 128, "dim": 32, "layers": 1, "heads": 2, "seq_len": 128},
        16 * MiB,
        (16, 32, 64),
        (48,),
    )
]


def profile_at(case: Case, seq_len: int) -> Profile:
    workload = load_workload(case.target, {**case.options, "seq_len": seq_len})
    return profile_workload(workload, make_backend("cpu", memory_limit_bytes=case.memory_limit))


def run_case(case: Case) -> list[list[str]]:
    profiles = {s: profile_at(case, s) for s in (*case.measured, *case.held_out)}
    rows = []
    for s in case.measured:
        found = profiles[s]
        rows.append(
            [
                case.label,
                str(s),
                "measured",
                str(found.max_micro_batch_size),
                "",
                "",
                "",
                str(len(found.probes)),
            ]
        )
    fitted = [profiles[s] for s in case.measured]
    for s in case.held_out:
        estimate = estimate_length(fitted, list(case.measured), s)
        truth = profiles[s]
        at = truth.probe_at(estimate.max_micro_batch_size)
        actual = at.footprint_bytes if at is not None else None
        error = (
            f"{estimate.expected_peak_bytes / actual - 1:+.2%}" if actual else "(size not probed)"
        )
        rows.append(
            [
                case.label,
                str(s),
                "held out",
                str(truth.max_micro_batch_size),
                str(estimate.max_micro_batch_size),
                format_bytes(estimate.expected_peak_bytes),
                error,
                str(len(truth.probes)),
            ]
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="held-out sequence length predictions")
    parser.add_argument("--quick", action="store_true", help="small smoke run; writes nothing")
    args = parser.parse_args(argv)
    rows: list[list[str]] = []
    for case in QUICK_CASES if args.quick else CASES:
        for row in run_case(case):
            rows.append(row)
            print("  ".join(row), flush=True)
    body = "\n\n".join(
        [
            "## Sequence length: held-out predictions (`bench/seqlen.py`)",
            f"Machine: {machine_line()}. CPU backend with a memory limit, model search, "
            "5% headroom. Each workload is profiled at three lengths; the fit "
            "`a₀ + a₁·s + b·m·s + c·m·s²` through their probes near the boundary estimates "
            "the held-out lengths, which are then profiled too.",
            markdown_table(
                [
                    "workload",
                    "seq_len",
                    "",
                    "M* measured",
                    "M* estimated",
                    "estimated peak",
                    "peak error",
                    "probes",
                ],
                rows,
            ),
            "Peak error: the estimate's peak at its M* against the peak measured at that "
            "size (the search probed it, or the error says so). Target: within 2%, M* "
            "exact or one below, never above.",
        ]
    )
    print()
    print(body)
    if not args.quick:
        write_section("seqlen", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
