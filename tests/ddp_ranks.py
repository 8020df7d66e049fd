"""What each rank of the DDP tests runs, in its own process (gloo on the CPU)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from tests.accumulate_helpers import tiny_gpt
from tuner.train.accumulate import Accumulator

GLOBAL_BATCH = 12
STEPS = 2


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
