"""What each rank of the 2-D mesh accumulator tests runs, in its own process (gloo on the
CPU): ``examples.mesh_mlp`` as FSDP × tensor parallelism on a ``(dp, tp) = (2, 2)`` mesh,
one optimizer step per scenario, every scenario in one process group."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from tuner.engine.workload import Workload, load_workload

TP = 2
GROUP_BATCH = 4  # samples a data-parallel group trains on in one step
LR = 0.5
MAX_GRAD_NORM = 0.05  # below the batch's gradient norm: clipping scales the step
SIZES = {"features": 8, "dim": 16, "hidden": 32, "layers": 2, "seq_len": 4, "classes": 5}
SCENARIOS = ("mean", "units", "sum", "oom", "clip", "mismatch")


def mesh_mlp(tp: int = TP) -> Workload:
    """``examples.mesh_mlp`` at small sizes, SGD (its step is linear in the gradient, so
    parameters after the step show any error in it), on a ``(world / tp) × tp`` mesh."""
    workload = load_workload("examples.mesh_mlp:workload", dict(SIZES))
    workload.parallel = workload.parallel.model_copy(update={"tp": tp})
    workload.optimizer = lambda params: torch.optim.SGD(params, lr=LR)
    return workload


def group_batch(group: int, *, padded: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Data-parallel group ``group``'s samples; ``padded``: some labels are padding
    (-100), a different number in each sample and each group, so that micro batches and
    groups hold different numbers of loss units."""
    inputs, labels = mesh_mlp().make_batch(GROUP_BATCH, rank=group)
    if padded:
        labels = labels.clone()
        seq_len = labels.shape[1]
        for sample in range(GROUP_BATCH):
            kept = (sample * (group + 2) + group) % seq_len + 1  # 1 ..= seq_len tokens
            labels[sample, kept:] = -100
    return inputs, labels


def token_units(batch: tuple[torch.Tensor, torch.Tensor]) -> int:
    return int((batch[1] != -100).sum())


def summed_loss(
    model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, int]:
    inputs, labels = batch
    total = F.cross_entropy(model(inputs), labels.flatten(), reduction="sum")
    return total, token_units(batch)


def full_tensors(tensors: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    out: list[torch.Tensor | None] = []
    for tensor in tensors:
        if tensor is None:
            out.append(None)
            continue
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        out.append(full.detach().clone())
    return out


def run_mesh_rank(rank: int, world: int, port: int, out: str, scenarios: tuple[str, ...]) -> None:
    from tuner.core.errors import BadInputError
    from tuner.train.accumulate import Accumulator

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results: dict[str, Any] = {}
    try:
        for scenario in scenarios:
            workload = mesh_mlp()
            group = workload.parallel.mesh(world).group_of(rank)
            options: dict[str, Any] = {"split": [2, 2]}
            batch = group_batch(group, padded=scenario in ("units", "sum"))
            if scenario == "units":
                workload.loss_units = token_units
                options = {"split": [3, 1]}  # uneven: the units differ more
            elif scenario == "sum":
                workload.loss_fn = summed_loss  # type: ignore[assignment]
                options = {"split": [1, 3]}
            elif scenario == "oom":
                inner = workload.loss_fn

                def failing(model: nn.Module, part: Any, inner: Any = inner) -> torch.Tensor:
                    if part[0].shape[0] > 1:
                        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")
                    loss: torch.Tensor = inner(model, part)
                    return loss

                workload.loss_fn = failing
            elif scenario == "clip":
                options["max_grad_norm"] = MAX_GRAD_NORM
            elif scenario == "mismatch":
                # Drawn by the world rank, as a sampler that ignores the mesh would: the two
                # tensor-parallel ranks of a group see different samples.
                batch = mesh_mlp().make_batch(GROUP_BATCH, rank=rank)
            micro = max(options["split"])
            accumulator = Accumulator.for_workload(workload, micro, **options)
            try:
                report = accumulator.step(batch)
            except BadInputError as exc:
                results[scenario] = {"error": str(exc)}
                continue
            parameters = list(workload.model.parameters())
            results[scenario] = {
                "error": None,
                "grads": full_tensors([p.grad for p in parameters]),
                "params": full_tensors(list(parameters)),
                "loss": report.loss,
                "units": report.units,
                "split": report.split,
                "retries": report.oom_retries,
                "grad_norm": report.grad_norm,
            }
        torch.save(results, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
