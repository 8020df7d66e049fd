"""Micro batch sizes under DDP and FSDP at world sizes 1 to 4, measured on the CPU.

Each configuration is profiled on W real rank processes (gloo on 127.0.0.1), each under
the CPU backend's per-rank limit: DDP without bucket views, with bucket views but
gradients set to None, with bucket views zeroed in place (the default), and FSDP with
gradient sync every micro batch (the default) or on the last only. The one-process M*
stands beside them. Then the W = 3 answer is estimated from the FSDP profiles at W = 1,
2 and 4 (``tuner.core.worlds``) and compared with the real W = 3 profile.

With ``--mesh``, the 2-D cases instead (section ``distributed-mesh``): examples.mesh_mlp
(FSDP × tensor parallelism with its hand-written plan) at (dp, tp) = (4, 1), (2, 2) and
(1, 4) on 4 real gloo ranks, each shape also measured by one process standing for rank 0
on torch's fake process group (the step peak of both at every size the real search
probed), fake-world shapes beyond the machine, and the (2, 2) answer estimated from the
other fake-world shapes against its measurement.

Run: ``python bench/distributed.py`` (about 20 minutes on 2 cores), ``--mesh`` (about 5
minutes), or ``--quick`` for a smoke run that writes nothing.
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
from tuner.core.shape import MeshShape
from tuner.core.units import format_bytes
from tuner.core.worlds import estimate_world_size
from tuner.engine.backends import make_backend
from tuner.engine.fake_group import fake_process_group
from tuner.engine.fake_world import profile_fake_world
from tuner.engine.launch import profile_distributed
from tuner.engine.probe import Prober
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


MESH = "examples.mesh_mlp:workload"
MESH_OPTIONS: dict[str, object] = {}  # the example's defaults: 4 blocks of 128 → 512 → 128
REAL_SHAPES = [(4, 1), (2, 2), (1, 4)]
FAKE_SHAPES = [(8, 1), (4, 2), (2, 4), (1, 4), (4, 1), (8, 2), (64, 8)]
HELD_OUT = (2, 2)


def _mesh(tp: int) -> Parallel:
    return Parallel(mode="fsdp", tp=tp, tp_plan="workload")


def fake_profile(shape: tuple[int, int], limit: int) -> Profile:
    workload = load_workload(MESH, dict(MESH_OPTIONS))
    workload.parallel = _mesh(shape[1])
    return profile_fake_world(
        workload,
        make_backend("cpu", memory_limit_bytes=limit),
        world_size=shape[0] * shape[1],
        headroom=0.05,
        strategy="model",
        size_cap=4096,
    )


def fake_peaks(shape: tuple[int, int], limit: int, sizes: list[int]) -> dict[int, int]:
    """The step peak (what a GPU holds) of rank 0 at each size, in a fake world."""
    workload = load_workload(MESH, dict(MESH_OPTIONS))
    workload.parallel = _mesh(shape[1])
    backend = make_backend("cpu", memory_limit_bytes=limit)
    with (
        fake_process_group(shape[0] * shape[1]),
        backend.session(),
        Prober(workload, backend) as prober,
    ):
        return {
            size: prober(size, enforce_capacity=False).peak_allocated_bytes or 0 for size in sizes
        }


def mesh_main(quick: bool) -> None:
    limit = 16 * MiB if quick else LIMIT
    started = time.perf_counter()
    rows = []
    for shape in REAL_SHAPES[:1] if quick else REAL_SHAPES:
        real = profile_distributed(
            MESH,
            options=MESH_OPTIONS,
            device="cpu",
            memory_limit_bytes=limit,
            world_size=shape[0] * shape[1],
            parallel=_mesh(shape[1]),
            headroom=0.05,
            strategy="model",
            size_cap=4096,
        )
        fake = fake_profile(shape, limit)
        sizes = [p.micro_batch_size for p in real.probes if p.peak_allocated_bytes]
        peaks = fake_peaks(shape, limit, sizes)
        gaps = [
            (p.peak_allocated_bytes or 0) - peaks[p.micro_batch_size]
            for p in real.probes
            if p.peak_allocated_bytes
        ]
        at_max = real.probe_at(real.max_micro_batch_size)
        copies = at_max.breakdown.collective_copies_bytes if at_max and at_max.breakdown else 0
        row = [
            f"({shape[0]}, {shape[1]})",
            str(real.max_micro_batch_size),
            format_bytes(copies),
            str(fake.max_micro_batch_size),
            f"{len(sizes)}: {sum(g == 0 for g in gaps)} equal, most {format_bytes(max(gaps))}",
        ]
        print(" | ".join(row), flush=True)
        rows.append(row)
    fakes = {shape: fake_profile(shape, limit) for shape in [*FAKE_SHAPES, HELD_OUT]}
    beyond = "; ".join(
        f"({dp}, {tp}) {dp * tp} ranks, M* {p.max_micro_batch_size} at {peak_at_max(p)}"
        for (dp, tp), p in fakes.items()
    )
    known = [p for shape, p in fakes.items() if shape != HELD_OUT]
    mesh = MeshShape.of(*HELD_OUT)
    estimate = estimate_world_size(known, mesh)
    measured = fakes[HELD_OUT]
    probe = measured.probe_at(measured.max_micro_batch_size)
    assert probe is not None
    assert probe.footprint_bytes
    predicted = estimate.fit.predict(measured.max_micro_batch_size, mesh)
    error = (predicted - probe.footprint_bytes) / probe.footprint_bytes
    elapsed = time.perf_counter() - started
    line = (
        f"(2, 2) estimated from {len(known)} other shapes: M* {estimate.max_micro_batch_size} "
        f"against {measured.max_micro_batch_size} measured; the peak at the measured M* "
        f"predicted {format_bytes(predicted)} against {format_bytes(probe.footprint_bytes)} "
        f"({error:+.2%}); the fit within {estimate.fit.max_relative_error:.2%} of every "
        f"peak it was fitted to"
    )
    print(line)
    if quick:
        return
    body = "\n\n".join(
        [
            "## FSDP × tensor parallelism on a 2-D mesh (`bench/distributed.py --mesh`)",
            f"Machine: {machine_line()}. examples.mesh_mlp (4 blocks, 128 → 512 → 128, "
            "sequences of 16, AdamW), its own plan (up column-wise, down row-wise), "
            f"{format_bytes(limit)} per rank (5% headroom).",
            "Real ranks against the fake world: each shape profiled on 4 gloo ranks "
            "(127.0.0.1), then by one process standing for rank 0 on torch's fake process "
            "group. The step peak (what a GPU holds) is compared at every size the real "
            "search probed: equal to the byte except where a real rank still held a "
            "collective's buffer. The M*s differ by what each counts beyond the peak: a "
            "real CPU rank its gloo copies (the process's memory, against the limit; NCCL "
            "makes none), the fake world one collective in flight (the largest buffer of "
            "the step, as a real collective keeps its tensors until it completes).",
            markdown_table(
                [
                    "(dp, tp)",
                    "real M* (gloo)",
                    "gloo copies at M*",
                    "fake-world M*",
                    "sizes compared: step peak real − fake",
                ],
                rows,
            ),
            f"Fake-world shapes (dp, tp), 512 ranks beyond any machine here: {beyond}. "
            f"{line}. Wall time: {elapsed / 60:.1f} min.",
        ]
    )
    write_section("distributed-mesh", body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run, writes nothing")
    parser.add_argument("--mesh", action="store_true", help="the 2-D mesh cases")
    args = parser.parse_args()
    if args.mesh:
        mesh_main(args.quick)
        return
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
    estimate = estimate_world_size(known, MeshShape(held_out))
    real = results[fsdp, held_out]
    real_probe = real.probe_at(real.max_micro_batch_size)
    predicted_peak = estimate.fit.predict(real.max_micro_batch_size, MeshShape(held_out))
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
            "holds between micro batches: DDP's bucket copy, FSDP's unsharded gradients). "
            f"One process (no wrapper): M* {single.max_micro_batch_size}, peak "
            f"{peak_at_max(single)}.",
            markdown_table(["configuration", *[f"W = {w}" for w in worlds]], rows),
            f"W = {held_out} estimated from the FSDP (sync every micro batch) profiles at W = "
            f"{', '.join(map(str, estimate.based_on))} with peak(m, W) ≈ a + b·m + s/W: "
            f"M* {estimate.max_micro_batch_size} against {real.max_micro_batch_size} measured; "
            f"the peak at the measured M* predicted {format_bytes(predicted_peak)} against "
            f"{real_peak} measured "
            f"({peak_error:+.2%}). The fit stays within "
            f"{estimate.fit.max_relative_error:.2%} of every peak it was fitted to. "
            f"Wall time of the whole run: {elapsed / 60:.1f} min.",
        ]
    )
    write_section("distributed", body)


if __name__ == "__main__":
    main()
