"""What each rank of the DDP tests runs, in its own process (gloo on the CPU)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from tests.accumulate_helpers import tiny_gpt
from tuner.train.accumulate import Accumulator

GLOBAL_BATCH = 12
STEPS = 2


def run_ranks(
    function: Callable[..., None], args: tuple[Any, ...], out: Path, *, world: int, timeout_s: int
) -> list[dict[str, Any]]:
    """``function(rank, *args)`` in ``world`` spawned processes; each saves its results to
    ``out/rank{rank}.pt``. A stuck rank fails the test after ``timeout_s`` instead of
    hanging it."""
    context = mp.start_processes(
        function, args=args, nprocs=world, join=False, start_method="spawn"
    )
    for _ in range(timeout_s):
        if context.join(timeout=1):
            break
    else:
        for process in context.processes:
            process.kill()
        pytest.fail(f"ranks did not finish within {timeout_s} s")
    return [torch.load(out / f"rank{rank}.pt") for rank in range(world)]


def global_batch() -> dict[str, torch.Tensor]:
    torch.manual_seed(1234)
    return tiny_gpt().make_batch(GLOBAL_BATCH)


def run_rank(
    rank: int, world: int, port: int, out: str, sync: str, oom_on_rank0_above: int
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        workload = tiny_gpt()
        per_rank = GLOBAL_BATCH // world
        batch = {k: v[rank * per_rank : (rank + 1) * per_rank] for k, v in global_batch().items()}
        model = DistributedDataParallel(workload.model)
        calls = [0]

        # DDP checks these parameters' annotations, which postponed evaluation turns into
        # strings, so the hook stays unannotated.
        def counting_hook(state, bucket):  # type: ignore[no-untyped-def]
            calls[0] += 1
            return allreduce_hook(None, bucket)

        model.register_comm_hook(None, counting_hook)

        def loss_fn(module: torch.nn.Module, part: dict[str, torch.Tensor]) -> torch.Tensor:
            if rank == 0 and part["input_ids"].shape[0] > oom_on_rank0_above:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
            return workload.loss_fn(module, part)

        accumulator = Accumulator(
            model,
            torch.optim.SGD(model.parameters(), lr=0.0),
            micro_batch_size=4,
            loss_fn=loss_fn,
            loss_units=workload.loss_units,
            sync=sync,  # type: ignore[arg-type]
        )
        reports = [accumulator.step(batch) for _ in range(STEPS)]
        torch.save(
            {
                "grads": [p.grad.detach().clone() for p in model.module.parameters()],
                "ddp_allreduces": calls[0],
                "micro_batch_size": accumulator.micro_batch_size,
                "splits": [r.split for r in reports],
                "retries": [r.oom_retries for r in reports],
            },
            Path(out) / f"rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


def run_parallel_rank(
    rank: int, world: int, port: int, out: str, mode: str, gradient_sync: str, oom_above: int
) -> None:
    """The accumulator on a workload declared DDP or FSDP: ``for_workload`` wraps the
    model the way the probe does; one step of ``GLOBAL_BATCH // world`` samples a rank.
    ``oom_above``: every rank runs out of memory on micro batches larger than this."""
    from tuner.core.parallel import Parallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        workload = tiny_gpt()
        workload.parallel = Parallel(mode=mode, gradient_sync=gradient_sync)  # type: ignore[arg-type]
        workload.optimizer = lambda params: torch.optim.SGD(params, lr=0.0)
        inner_loss = workload.loss_fn

        def loss_fn(module: torch.nn.Module, part: dict[str, torch.Tensor]) -> torch.Tensor:
            if part["input_ids"].shape[0] > oom_above:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
            return inner_loss(module, part)

        workload.loss_fn = loss_fn
        per_rank = GLOBAL_BATCH // world
        batch = {k: v[rank * per_rank : (rank + 1) * per_rank] for k, v in global_batch().items()}
        accumulator = Accumulator.for_workload(workload, 4)
        reports = [accumulator.step(batch) for _ in range(STEPS)]
        grads = []
        for parameter in workload.model.parameters():
            grad = parameter.grad
            full = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
            grads.append(full.detach().clone())
        torch.save(
            {
                "grads": grads,
                "wrapper": type(accumulator.model).__name__,
                "micro_batch_size": accumulator.micro_batch_size,
                "splits": [r.split for r in reports],
                "retries": [r.oom_retries for r in reports],
            },
            Path(out) / f"rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()
