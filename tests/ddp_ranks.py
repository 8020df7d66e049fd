"""What each rank of the DDP tests runs, in its own process (gloo on the CPU)."""

from __future__ import annotations

import os
import sys
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
        _then_leave, args=(function, *args), nprocs=world, join=False, start_method="spawn"
    )
    for _ in range(timeout_s):
        if context.join(timeout=1):
            break
    else:
        for process in context.processes:
            process.kill()
        pytest.fail(f"ranks did not finish within {timeout_s} s")
    return [torch.load(out / f"rank{rank}.pt") for rank in range(world)]


def _then_leave(rank: int, function: Callable[..., None], *args: Any) -> None:
    """``function(rank, *args)``, then the process ends without the interpreter's teardown,
    which spends seconds collecting torch's objects (the results are saved by then; an
    exception still ends the rank as torch.multiprocessing reports it)."""
    function(rank, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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
            split=[4, 2],  # uneven, as given: the last micro batch is smaller
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
        accumulator = Accumulator.for_workload(workload, 4, split=[4, 2])
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


class Branches(torch.nn.Module):
    """Each sample takes one branch: ``a`` and ``b`` have the same shapes, the path
    through ``c1``/``c2`` others, and ``unused`` is never taken. Ranks that route their
    samples differently leave different parameters without gradients."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)
        self.c1 = torch.nn.Linear(4, 6)
        self.c2 = torch.nn.Linear(6, 4)
        self.unused = torch.nn.Linear(4, 4)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        x, route = batch["x"], batch["route"]
        outputs = torch.zeros_like(x)
        for value, branch in ((0, self.a), (1, self.b), (2, lambda t: self.c2(self.c1(t)))):
            chosen = route == value
            if chosen.any():
                outputs = outputs.index_put((chosen.nonzero().flatten(),), branch(x[chosen]))
        return outputs


def branches_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(batch).pow(2).sum(dim=1).mean()


def branches_batch(rank: int) -> dict[str, torch.Tensor]:
    """Rank 0 routes to ``a`` and the ``c`` path, rank 1 to ``b`` only."""
    generator = torch.Generator().manual_seed(10 + rank)
    routes = [0, 2, 0, 2] if rank == 0 else [1, 1, 1, 1]
    return {"x": torch.randn(4, 4, generator=generator), "route": torch.tensor(routes)}


def padded_batch(rank: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s 3 samples of :func:`global_batch`; rank 1's last has no labels."""
    batch = {k: v[rank * 3 : rank * 3 + 3].clone() for k, v in global_batch().items()}
    if rank == 1:
        batch["labels"][-1] = -100
    return batch


def run_edge_rank(rank: int, world: int, port: int, out: str) -> None:
    """The corners of the accumulator under DDP, one after the other in one group."""
    from tuner.core.errors import BadInputError
    from tuner.core.parallel import Parallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results: dict[str, Any] = {}
    try:
        # 1. sync="safe" with ranks that used different parameters.
        model = Branches()
        accumulator = Accumulator(
            model, torch.optim.SGD(model.parameters(), lr=0.0), 2, branches_loss
        )
        accumulator.step(branches_batch(rank))
        results["branches"] = {
            name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()
        }

        # 2. sync="ddp" on a model that is not wrapped in DDP: refused, on every rank.
        workload = tiny_gpt()
        unwrapped = Accumulator(
            workload.model,
            torch.optim.SGD(workload.model.parameters(), lr=0.0),
            2,
            workload.loss_fn,
            sync="ddp",
        )
        try:
            unwrapped.step(padded_batch(rank))
        except BadInputError as exc:
            results["unwrapped"] = str(exc)

        # 3. A micro batch with no units, as the last under DDP's reducer (its backward
        #    all-reduces), and under FSDP (every backward has collectives).
        for label in ("ddp", "safe", "fsdp"):
            workload = tiny_gpt()
            if label == "fsdp":
                workload.parallel = Parallel(mode="fsdp")
                workload.optimizer = lambda params: torch.optim.SGD(params, lr=0.0)
                accumulator = Accumulator.for_workload(workload, 1)
            else:
                wrapped = DistributedDataParallel(workload.model)
                accumulator = Accumulator(
                    wrapped,
                    torch.optim.SGD(wrapped.parameters(), lr=0.0),
                    1,
                    workload.loss_fn,
                    workload.loss_units,
                    sync=label,  # type: ignore[arg-type]
                )
            report = accumulator.step(padded_batch(rank))
            grads = []
            for parameter in workload.model.parameters():
                grad = parameter.grad
                full = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
                grads.append(full.detach().clone())
            results[f"empty {label}"] = {"grads": grads, "loss": report.loss}

        # 4. An out-of-memory on every rank is reported once, from rank 0.
        workload = tiny_gpt()
        calls: list[tuple[int, int]] = []

        def failing(module: torch.nn.Module, part: dict[str, torch.Tensor]) -> torch.Tensor:
            if part["input_ids"].shape[0] > 1:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
            return workload.loss_fn(module, part)

        accumulator = Accumulator(
            workload.model,
            torch.optim.SGD(workload.model.parameters(), lr=0.0),
            3,
            failing,
            workload.loss_units,
            on_oom=lambda failed, new, message: calls.append((failed, new)),
        )
        accumulator.step(padded_batch(rank))
        results["oom calls"] = calls
        torch.save(results, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
