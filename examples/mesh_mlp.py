"""A residual MLP stack with a hand-written tensor-parallel plan: FSDP × TP on a 2-D mesh.

Profile it on 4 ranks as a 2 × 2 mesh, or one rank of a 64 × 8 mesh in one process::

    tuner profile examples.mesh_mlp:workload --world-size 4 --tp 2 --memory-limit 64MiB
    tuner profile examples.mesh_mlp:workload --world-size 512 --tp 8 --fake-world

Each block's first layer is split column-wise (its output features over the tp ranks),
its second row-wise (an all-reduce sums the partial outputs), as Megatron splits an MLP;
FSDP then shards each block's tensor-parallel shards across the data-parallel groups.
``make_batch(n, rank=r)`` draws data-parallel group r's samples.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from tuner.core.parallel import Parallel
from tuner.engine.workload import ShardFn, Workload


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.down(F.gelu(self.up(self.norm(x))))
        return out


class MeshMlp(nn.Module):
    def __init__(self, *, features: int, dim: int, hidden: int, layers: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.Linear(features, dim)
        self.blocks = nn.ModuleList(Block(dim, hidden) for _ in range(layers))
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        # The head sees (samples × positions, dim): its output is not a view, which FSDP's
        # root would have to warn about.
        out: torch.Tensor = self.head(x.flatten(0, 1))
        return out


def tp_plan(model: nn.Module, tp_mesh: Any) -> None:
    """Column-wise ``up``, row-wise ``down`` in every block (Megatron's MLP split)."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    for block in model.blocks:  # type: ignore[union-attr]
        parallelize_module(block, tp_mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})


def shard_blocks(model: nn.Module, fully_shard: ShardFn) -> None:
    for block in model.blocks:  # type: ignore[union-attr]
        fully_shard(block)
    fully_shard(model)


def workload(
    *,
    features: int = 32,
    dim: int = 128,
    hidden: int = 512,
    layers: int = 4,
    seq_len: int = 16,
    classes: int = 8,
) -> Workload:
    torch.manual_seed(0)
    model = MeshMlp(features=features, dim=dim, hidden=hidden, layers=layers, classes=classes)

    def make_batch(n: int, rank: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(1000 + rank)
        inputs = torch.randn(n, seq_len, features, generator=generator)
        return inputs, torch.randint(0, classes, (n, seq_len), generator=generator)

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, labels = batch
        return F.cross_entropy(model(inputs), labels.flatten())

    return Workload(
        name=f"mesh-mlp-{layers}x{dim}",
        model=model,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        make_batch=make_batch,
        loss_fn=loss_fn,
        parallel=Parallel(mode="fsdp"),
        shard=shard_blocks,
        tp_plan=tp_plan,
    )
