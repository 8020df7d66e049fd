"""Shared pieces of the accumulation tests: small real workloads and gradient comparison."""

from __future__ import annotations

import copy

import torch
from torch import nn

from tuner.engine.workload import Workload, load_workload


def mlp(**options: object) -> Workload:
    return load_workload(
        "examples.mlp:workload", {"in_features": 16, "hidden": 32, "layers": 2, **options}
    )


def tiny_gpt(**options: object) -> Workload:
    return load_workload(
        "examples.gpt:workload",
        {"vocab": 64, "seq_len": 16, "dim": 32, "layers": 1, "heads": 2, **options},
    )


def frozen_sgd(model: nn.Module) -> torch.optim.Optimizer:
    """lr 0: the step runs but parameters stay, so gradients can be compared after it."""
    return torch.optim.SGD(model.parameters(), lr=0.0)


def full_batch_gradients(
    workload: Workload, batch: object, *, precision: str = "fp32"
) -> list[torch.Tensor]:
    model = copy.deepcopy(workload.model)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    with torch.autocast("cpu", dtype=dtype) if dtype else torch.enable_grad():
        loss = workload.loss_fn(model, batch)
    loss.backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def gradients(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


def relative_difference(left: list[torch.Tensor], right: list[torch.Tensor]) -> float:
    a = torch.cat([t.flatten().double() for t in left])
    b = torch.cat([t.flatten().double() for t in right])
    return float((a - b).norm() / b.norm())
