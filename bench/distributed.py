"""Micro batch sizes under DDP and FSDP at world sizes 1 to 4, measured on the CPU.

Each configuration is profiled on W real rank processes (gloo on 127.0.0.1), each under
the CPU backend's per-rank limit: DDP without bucket views, with bucket views but
gradients set to None, with bucket views zeroed in place (the default), and FSDP with
gradient sync every micro batch (the default) or on the last only. The one-process M*
stands beside them. Then the W = 3 answer is estimated from the FSDP profiles at W = 1,
2 and 4 (``tuner.core.worlds``) and compared with the real W = 3 profile.

Run: ``python bench/distributed.py`` (about 20 minutes on 2 cores), or ``--quick`` for a
smoke run that writes nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine_line, markdown_table, write_section
from tuner.core.parallel import Parallel
from tuner.core.results import Profile
from tuner.core.units import format_bytes
from tuner.core.worlds import estimate_world_size
from tuner.engine.backends import make_backend
from tuner.engine.launch import profile_distributed
from tuner.engine.profiler import profile_workload
from tuner.engine.workload import load_workload

MiB = 2**20
# A parameter-heavy LM for its size (an 8192-token vocabulary, short sequences), the case
# where gradients, optimizer state and DDP's bucket copy weigh as much as activations.
GPT = {"layers": 4, "dim": 128, "heads": 4, "vocab": 8192, "seq_len": 16}
LIMIT = 64 * MiB
QUICK_GPT = {"layers": 1, "dim": 64, "heads": 2, "vocab": 2048, "seq_len": 8}
QUICK_LIMIT = 8 * MiB


@dataclass(frozen=True)
class Config:
    label: str
    parallel: Parallel


CONFIGS = [
    Config("DDP, bucket view off", Parallel(mode="ddp", gradient_as_bucket_view=False)),
    Config("DDP, bucket view on, set_to_none", Parallel(mode="ddp", set_to_none=True)),
    Config("DDP, bucket view on, zeroed in place", Parallel(mode="ddp")),
    Config("FSDP, sync every micro batch", Parallel(mode="fsdp")),
    Config("FSDP, sync on the last", Parallel(mode="fsdp", gradient_sync="last")),
]


def profile(options: Mapping[str, object], limit: int, parallel: Parallel, world: int) -> Profile:
    return profile_distributed(
        "examples.gpt:workload",
        options=options,
        device="cpu",
        memory_limit_bytes=limit,
        world_size=world,
        parallel=parallel,
        headroom=0.05,
        strategy="model",
        size_cap=4096,
    )


def peak_at_max(result: Profile) -> str:
    probe = result.probe_at(result.max_micro_batch_size)
    return format_bytes(probe.peak_bytes) if probe is not None else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run, writes nothing")
    args = parser.parse_args()
    options, limit = (QUICK_GPT, QUICK_LIMIT) if args.quick else (GPT, LIMIT)
    worlds = [1, 2, 3] if args.quick else [1, 2, 3, 4]
    configs = CONFIGS[3:4] if args.quick else CONFIGS

    started = time.perf_counter()
    single = profile_workload(
        load_workload("examples.gpt:workload", dict(options)),
        make_backend("cpu", memory_limit_bytes=limit),
    )
    print(f"one process: M* {single.max_micro_batch_size}, peak {peak_at_max(single)}")
    results: dict[tuple[str, int], Profile] = {}
    rows = []
    for config in configs:
        row = [config.label]
        for world in worlds:
            result = profile(options, limit, config.parallel, world)
            results[config.label, world] = result
            probe = result.probe_at(result.max_micro_batch_size)
            held = probe.breakdown.communication_bytes if probe and probe.breakdown else 0
            cell = (
                f"{result.max_micro_batch_size} ({peak_at_max(result)}, held {format_bytes(held)})"
            )
            print(f"{config.label}, W={world}: M* {cell}", flush=True)
            row.append(cell)
        rows.append(row)

    fsdp = CONFIGS[3].label
    held_out = 3 if 3 in worlds else worlds[-1]
    known = [results[fsdp, w] for w in worlds if w != held_out]
    estimate = estimate_world_size(known, held_out)
    real = results[fsdp, held_out]
    real_probe = real.probe_at(real.max_micro_batch_size)
    predicted_peak = estimate.fit.predict(real.max_micro_batch_size, held_out)
    peak_error = (
        (predicted_peak - real_probe.footprint_bytes) / real_probe.footprint_bytes
        if real_probe is not None and real_probe.footprint_bytes
        else float("nan")
    )
    elapsed = time.perf_counter() - started
    real_peak = format_bytes(real_probe.footprint_bytes if real_probe else None)
    print(
        f"W={held_out} from {estimate.based_on}: estimated M* {estimate.max_micro_batch_size}, "
        f"measured {real.max_micro_batch_size}; peak at the measured M* predicted "
        f"{format_bytes(predicted_peak)} vs {real_peak} ({peak_error:+.2%}); fit within "
        f"{estimate.fit.max_relative_error:.2%} of every measured peak; {elapsed / 60:.1f} min"
    )
    if args.quick:
        return
    body = "\n\n".join(
        [
            "## DDP and FSDP at world sizes 1 to 4 (`bench/distributed.py`)",
            f"Machine: {machine_line()}. Examples.gpt with {GPT}, AdamW, CPU backend with a "
            f"{format_bytes(LIMIT)} limit per rank (5% headroom), gloo on 127.0.0.1, one "
            "rank per process. Each cell: M* (the peak per rank at M*, and what the wrapper "
            "holds between micro batches: DDP's bucket copy, FSDP's unsharded gradients).",
            f"One process (no wrapper): M* {single.max_micro_batch_size}, peak "
            f"{peak_at_max(single)}.",
            markdown_table(["configuration", *[f"W = {w}" for w in worlds]], rows),
            f"W = {held_out} estimated from the FSDP (sync every micro batch) profiles at W = "
            f"{', '.join(map(str, estimate.based_on))} with peak(m, W) ≈ a + b·m + s/W: "
            f"M* {estimate.max_micro_batch_size} against {real.max_micro_batch_size} measured; "
            f"the peak at the measured M* predicted {format_bytes(predicted_peak)} against "
            f"{real_peak} measured "
            f"({peak_error:+.2%}). The fit stays within "
            f"{estimate.fit.max_relative_error:.2%} of every peak it was fitted to.",
            f"Wall time of the whole run: {elapsed / 60:.1f} min.",
        ]
    )
    write_section("distributed", body)


if __name__ == "__main__":
    main()
