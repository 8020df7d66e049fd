"""Workloads with declared variants and a known peak, importable as
``tests.variant_workloads:NAME`` by the CLI too. Each is a real, tiny training step."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from tuner.engine.workload import Precision, Workload

FEATURES = 16
SEQ_LEN = 32


class Stack(nn.Module):
    """An input layer, ``blocks`` (the first ``wide_blocks`` ``wide`` times wider than the
    rest), a head."""

    def __init__(
        self, width: int, layers: int, *, wide: int, wide_blocks: int, checkpointing: bool
    ) -> None:
        super().__init__()
        self.checkpointing = checkpointing
        self.embed = nn.Linear(FEATURES, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.Linear(width, width * (wide if i < wide_blocks else 1)),
                nn.GELU(),
                nn.Linear(width * (wide if i < wide_blocks else 1), width),
            )
            for i in range(layers)
        )
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = x + (checkpoint(block, x, use_reentrant=False) if self.checkpointing else block(x))
        out: torch.Tensor = self.head(x)
        return out


def stack(
    *,
    width: int = 32,
    layers: int = 3,
    wide: int = 4,
    wide_blocks: int = 1,
    seq_len: int = SEQ_LEN,
    checkpointing: bool = False,
    precision: Precision = "fp32",
) -> Workload:
    """A stack whose first block saves the most; checkpointing and precision are variants."""
    torch.manual_seed(0)
    model = Stack(width, layers, wide=wide, wide_blocks=wide_blocks, checkpointing=checkpointing)

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, seq_len, FEATURES), torch.randint(0, 4, (n, seq_len))

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, labels = batch
        return F.cross_entropy(model(inputs).flatten(0, 1).float(), labels.flatten())

    return Workload(
        name=f"stack-{layers}x{width}",
        model=model,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3, foreach=True),
        make_batch=make_batch,
        loss_fn=loss_fn,
        precision=precision,
        activation_checkpointing=checkpointing,
        variants={"checkpointing": [False, True], "precision": ["fp32", "bf16"]},
    )


def activations_heavy(*, checkpointing: bool = False, precision: Precision = "fp32") -> Workload:
    """Two blocks both 16 times wide on 256 tokens: what backward keeps dominates the weights
    and AdamW's state, so each variant lowers the peak and the two together the most.
    Measured with the plain allocator count at micro batch 1: 1,671,096 B as loaded,
    1,156,600 B in bf16, 1,156,856 B checkpointed, 888,184 B checkpointed in bf16 (and
    1,375,736 B at micro batch 2). The plain stack above cannot show this: its weights
    and optimizer state are most of its peak at one sample, and bf16's copies of the
    weights made "as loaded" its smallest variant there."""
    return stack(
        width=16,
        layers=2,
        wide=16,
        wide_blocks=2,
        seq_len=256,
        checkpointing=checkpointing,
        precision=precision,
    )


def weights_heavy() -> Workload:
    """Large weights and tiny activations under a multi-tensor AdamW: the optimizer step's
    temporary copies of the weights are the peak, not forward or backward."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 512), nn.Linear(512, 512), nn.Linear(512, 2))

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, 8), torch.randint(0, 2, (n,))

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, labels = batch
        return F.cross_entropy(model(inputs), labels)

    return Workload(
        name="weights-heavy",
        model=model,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3, foreach=True),
        make_batch=make_batch,
        loss_fn=loss_fn,
    )
