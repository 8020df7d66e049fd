"""A multi-layer perceptron classifier: the cheapest real workload."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from tuner.engine.workload import OptimizerFactory, Precision, Workload


def workload(
    *,
    in_features: int = 256,
    hidden: int = 512,
    layers: int = 3,
    classes: int = 10,
    optimizer: str = "adamw",
    precision: Precision = "fp32",
) -> Workload:
    """An MLP with ``layers`` hidden layers of width ``hidden``, trained with AdamW or SGD."""
    torch.manual_seed(0)
    blocks: list[nn.Module] = []
    width = in_features
    for _ in range(layers):
        blocks += [nn.Linear(width, hidden), nn.GELU()]
        width = hidden
    model = nn.Sequential(*blocks, nn.Linear(width, classes))

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, in_features), torch.randint(0, classes, (n,))

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, targets = batch
        return F.cross_entropy(model(inputs), targets)

    return Workload(
        name=f"mlp-{layers}x{hidden}",
        model=model,
        optimizer=_optimizer(optimizer),
        make_batch=make_batch,
        loss_fn=loss_fn,
        precision=precision,
    )


def _optimizer(name: str) -> OptimizerFactory:
    if name == "adamw":
        return lambda params: torch.optim.AdamW(params, lr=1e-3)
    if name == "sgd":
        return lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9)
    raise ValueError(f"unknown optimizer {name!r}: use adamw or sgd")
