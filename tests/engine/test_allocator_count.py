"""The CPU tracker against the allocator's own count (every thread, torch.profiler's memory
events), on real gloo ranks (127.0.0.1, time-boxed) and in one process.

Under DDP and in one process every allocation is the step thread's and the two agree to the
byte. Under FSDP gloo's worker threads gather into temporaries of each all-gather's size and
its work holds tensors past the step's own references: the process holds more than the
tracker (which stands for a GPU); the profile keeps the tracker's peak and checks the limit
with the process's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.ddp_ranks import run_ranks
from tuner.core.parallel import Parallel
from tuner.engine.launch import _free_port, profile_distributed

MiB = 2**20
GPT = {"layers": 2, "dim": 64, "heads": 2, "vocab": 2048, "seq_len": 8}
# Parameter-heavy (an 8192-token vocabulary, 16-token sequences): gloo's copies of a
# block's and the embedding's parameters weigh as much as a sample's activations.
FSDP_GPT = {"layers": 2, "dim": 128, "heads": 4, "vocab": 8192, "seq_len": 16}
BLOCK_GATHERED_BYTES = (12 * 128 * 128 + 13 * 128) * 4  # a block's parameters, whole
TIMEOUT_S = 240


def count_rank(
    rank: int, world: int, port: int, out: str, mode: str, size: int, options: dict[str, int]
) -> None:
    """Three tracked steps at ``size``, counted by the tracker and by the allocator (every
    thread) over the same block; both figures include what was live at its start."""
    from tuner.engine.backends import make_backend
    from tuner.engine.backends.allocations import all_thread_allocations
    from tuner.engine.batching import to_device
    from tuner.engine.probe import Prober
    from tuner.engine.workload import load_workload

    torch.set_num_threads(1)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        workload = load_workload("examples.gpt:workload", options)
        workload.parallel = Parallel(mode=mode)  # type: ignore[arg-type]
        backend = make_backend("cpu", memory_limit_bytes=2**30)
        with backend.session(), Prober(workload, backend, headroom=0.0, rank=rank) as prober:
            prober(size)  # warm: optimizer state and the wrappers' buffers exist
            batch = to_device(workload.sample_batch(size, rank=rank), backend.device)
            with backend.track(prober._resident(batch)) as reading:
                start = backend.current_bytes()
                with all_thread_allocations() as count:
                    for _ in range(3):
                        prober._step(batch, None)
        torch.save(
            {
                "tracker": reading.allocated_bytes,
                "all_threads": start + count.peak_bytes,
                "other_threads": count.other_threads_allocations,
            },
            Path(out) / f"rank{rank}.pt",
        )
    finally:
        if world > 1:
            dist.destroy_process_group()


def _counts(
    tmp_path: Path, mode: str, size: int, options: dict[str, int], world: int = 2
) -> list[dict]:  # type: ignore[type-arg]
    if world == 1:
        count_rank(0, 1, 0, str(tmp_path), mode, size, options)
        return [torch.load(tmp_path / "rank0.pt")]
    args = (world, _free_port(), str(tmp_path), mode, size, options)
    return run_ranks(count_rank, args, tmp_path, world=world, timeout_s=TIMEOUT_S)


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "world"), [("ddp", 2), ("none", 1)])
def test_without_gloo_copies_the_tracker_counts_what_the_allocator_counts(
    tmp_path: Path, mode: str, world: int
) -> None:
    for counted in _counts(tmp_path, mode, 2, GPT, world):
        assert counted["tracker"] == counted["all_threads"]
        assert counted["other_threads"] == {}


@pytest.mark.slow
def test_fsdp_on_gloo_other_threads_gather_into_copies_the_tracker_does_not_see(
    tmp_path: Path,
) -> None:
    for counted in _counts(tmp_path, "fsdp", 4, FSDP_GPT):
        # One temporary of the all-gather's size per all-gather, on gloo's threads: each
        # block is gathered in forward and again in backward, 2 micro batches, 3 steps.
        assert counted["other_threads"].get(BLOCK_GATHERED_BYTES) == 2 * 2 * 2 * 3
        assert counted["all_threads"] >= counted["tracker"]


@pytest.mark.slow
def test_fsdp_on_cpu_checks_the_limit_with_every_thread_and_keeps_the_gpu_peak(
    tmp_path: Path,
) -> None:
    # A limit that holds what the tracker counts at micro batch 4 and two of gloo's largest
    # copies (the embedding's parameters, gathered), and the run-to-run variation of both
    # counts: the step thread's peak moves by a gathered block's parameters (measured
    # 29,170,576 and 29,961,616 B at micro batch 1), the all-thread count by more. A margin
    # of 64 KiB failed one CI run in a few at micro batch 1, 1 MiB one local run in eleven.
    at_four = _counts(tmp_path, "fsdp", 4, FSDP_GPT)
    copies = 2 * max(at_four[0]["other_threads"])
    limit = max(counted["tracker"] for counted in at_four) + copies + 4 * MiB
    profile = profile_distributed(
        "examples.gpt:workload",
        options=FSDP_GPT,
        device="cpu",
        memory_limit_bytes=limit,
        world_size=2,
        parallel=Parallel(mode="fsdp"),
        headroom=0.0,
        strategy="model",
        size_cap=4096,
        probe_timeout_s=TIMEOUT_S,
    )
    best = profile.probe_at(profile.max_micro_batch_size)
    assert best is not None, [
        (p.micro_batch_size, p.fits, p.peak_bytes, p.collective_copies_bytes, p.error)
        for p in profile.probes
    ] + [limit]
    assert best.peak_bytes is not None
    # The profile's peak is the GPU-standing figure; gloo's share is said apart and is in
    # the footprint the limit was checked with.
    assert best.footprint_bytes == best.peak_bytes + best.collective_copies_bytes
    assert best.footprint_bytes <= limit
    assert any(probe.collective_copies_bytes > 0 for probe in profile.probes)
    # Training at M*, counted by the allocator over every thread, stays within the limit.
    # (Not compared with the probe's tracker peak: under FSDP on gloo, how long gloo's
    # workers hold tensors the step thread made varies from run to run, and so does the
    # step thread's own count; measured 29,963,664 B against the probe's 29,170,576 B.)
    for counted in _counts(tmp_path, "fsdp", profile.max_micro_batch_size, FSDP_GPT):
        assert counted["all_threads"] <= limit, (profile.max_micro_batch_size, counted)
