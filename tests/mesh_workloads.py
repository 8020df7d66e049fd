"""Workloads on a 2-D mesh for tests, importable by ranks as ``tests.mesh_workloads:NAME``."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from examples.mesh_mlp import MeshMlp, shard_blocks, tp_plan
from tuner.core.parallel import Parallel
from tuner.engine.workload import Workload

FEATURES, CLASSES, SEQ_LEN = 8, 4, 4


class Routed(nn.Module):
    """Keeps only the positions whose all-reduced activation is positive: how many it keeps
    (and so its memory) depends on the values the ranks exchange, as routing does."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = MeshMlp(features=FEATURES, dim=16, hidden=32, layers=1, classes=CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.inner(x)
        return out[out[:, 0] > 0]


def routed() -> Workload:
    torch.manual_seed(0)
    model = Routed()

    def make_batch(n: int, rank: int = 0) -> torch.Tensor:
        return torch.randn(n, SEQ_LEN, FEATURES, generator=torch.Generator().manual_seed(rank))

    def loss_fn(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        kept = model(batch)
        return F.cross_entropy(kept, torch.zeros(len(kept), dtype=torch.long))

    def plan(model: nn.Module, tp_mesh: Any) -> None:
        tp_plan(model.inner, tp_mesh)  # type: ignore[arg-type]

    def shard(model: nn.Module, fully_shard: Any) -> None:
        shard_blocks(model.inner, fully_shard)  # type: ignore[arg-type]
        fully_shard(model)

    return Workload(
        name="routed",
        model=model,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        make_batch=make_batch,
        loss_fn=loss_fn,
        parallel=Parallel(mode="fsdp", tp=2, tp_plan="workload"),
        shard=shard,
        tp_plan=plan,
    )
