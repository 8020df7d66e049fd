"""Workload factories for tests, importable as ``tests.workloads:NAME`` by the CLI too.

Each is a real, tiny training step; the broken ones break in one deliberate way.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from tuner.engine.workload import OptimizerFactory, Precision, Workload

FEATURES = 8
CLASSES = 4


class Tiny(nn.Module):
    """Two linear layers over ``(batch, seq_len, FEATURES)`` inputs."""

    def __init__(self, width: int, *, checkpointing: bool = False) -> None:
        super().__init__()
        self.checkpointing = checkpointing
        self.first = nn.Linear(FEATURES, width)
        self.second = nn.Linear(width, CLASSES)

    def _hidden(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.first(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = (
            checkpoint(self._hidden, x, use_reentrant=False)
            if self.checkpointing
            else self._hidden(x)
        )
        out: torch.Tensor = self.second(hidden)
        return out


def tiny(
    *,
    width: int = 16,
    seq_len: int = 4,
    seed: int = 0,
    optimizer: OptimizerFactory | None = None,
    precision: Precision = "fp32",
    checkpointing: bool = False,
) -> Workload:
    """A small sequence classifier trained with AdamW unless told otherwise."""
    torch.manual_seed(seed)
    model = Tiny(width, checkpointing=checkpointing)

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, seq_len, FEATURES), torch.randint(0, CLASSES, (n, seq_len))

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, labels = batch
        return F.cross_entropy(model(inputs).flatten(0, 1), labels.flatten())

    return Workload(
        model=model,
        optimizer=optimizer or (lambda params: torch.optim.AdamW(params, lr=1e-3)),
        make_batch=make_batch,
        loss_fn=loss_fn,
        precision=precision,
        activation_checkpointing=checkpointing,
    )


def first_layer(workload: Workload) -> nn.Linear:
    """The first layer of a ``tiny`` workload's model."""
    model = workload.model
    assert isinstance(model, Tiny)
    return model.first


def non_scalar_loss() -> Workload:
    """loss_fn forgets to reduce: it returns one loss per sample."""
    workload = tiny()

    def per_sample(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, labels = batch
        logits = model(inputs)
        return F.cross_entropy(logits.transpose(1, 2), labels, reduction="none").mean(dim=1)

    workload.loss_fn = per_sample
    return workload


class WorkloadBug(ValueError):
    """Raised by ``raising_loss``: a bug in the user's code, not an out-of-memory."""


def raising_loss(*, after_calls: int = 3) -> Workload:
    """loss_fn works ``after_calls`` times (steps change the model), then raises."""
    workload = tiny()
    calls = 0
    inner = workload.loss_fn

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        nonlocal calls
        calls += 1
        if calls > after_calls:
            raise_workload_bug(calls)
        return inner(model, batch)

    workload.loss_fn = loss_fn
    return workload


def raise_workload_bug(calls: int) -> None:
    """A named frame that must show up in the traceback the user sees."""
    raise WorkloadBug(f"label index out of range in call {calls}")


def runtime_error_loss() -> Workload:
    """loss_fn raises a plain RuntimeError: not an out-of-memory, must not be retried."""
    workload = tiny()

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 9x16)")

    workload.loss_fn = loss_fn
    return workload


def wrong_batch_size() -> Workload:
    """make_batch returns one sample more than asked for."""
    workload = tiny()
    inner = workload.make_batch
    workload.make_batch = lambda n: inner(n + 1)
    return workload


def not_a_workload() -> dict[str, str]:
    """Returns something that is not a Workload."""
    return {"model": "not really"}


NOT_CALLABLE = 42

PREBUILT = tiny(width=8)


def oom_on_rank_one(*, above: int = 3) -> Workload:
    """The small GPT under DDP, whose rank 1 alone runs out of memory in the forward of a
    micro batch larger than ``above``: the other rank goes on into the step's all-reduce
    and would wait there for ever if nobody ended it."""
    import torch.distributed as dist

    from examples.gpt import workload as gpt

    workload = gpt(layers=1, dim=32, heads=2, vocab=128, seq_len=8, parallel="ddp")
    inner = workload.loss_fn

    def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if dist.get_rank() == 1 and batch["input_ids"].shape[0] > above:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return inner(model, batch)

    workload.loss_fn = loss_fn
    return workload


def tiny_ranks(*, width: int = 16, seq_len: int = 4) -> Workload:
    """:func:`tiny` whose ``make_batch`` draws each rank's own samples, so that it profiles
    under DDP on several ranks (``tests.workloads:tiny_ranks``)."""
    torch.manual_seed(0)

    def make_batch(n: int, rank: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(rank)
        inputs = torch.randn(n, seq_len, FEATURES, generator=generator)
        return inputs, torch.randint(0, CLASSES, (n, seq_len), generator=generator)

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, labels = batch
        return F.cross_entropy(model(inputs).flatten(0, 1), labels.flatten())

    return Workload(
        model=Tiny(width),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        make_batch=make_batch,
        loss_fn=loss_fn,
    )
