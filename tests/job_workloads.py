"""Workloads for the job worker's tests, importable as ``tests.job_workloads:NAME`` by the
``tuner profile`` subprocesses a worker starts (from the repository root).

Each is a real, tiny training step that takes a controlled time, or breaks in one
deliberate way: raises, kills its own process, or never finishes.
"""

from __future__ import annotations

import os
import time

import torch
from torch import nn
from torch.nn import functional as F

from tuner.engine.workload import Workload

FEATURES = 8
CLASSES = 4


def _workload(name: str, before_loss: float | None = None, *, crash: str | None = None) -> Workload:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, FEATURES), torch.randint(0, CLASSES, (n,))

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if crash == "exit":
            os._exit(70)  # dies as a segfaulting extension would: no exception, no cleanup
        if crash == "raise":
            raise RuntimeError("deliberate bug in the workload's loss function")
        if before_loss is not None:
            time.sleep(before_loss)
        inputs, labels = batch
        return F.cross_entropy(model(inputs), labels)

    return Workload(
        name=name,
        model=model,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        make_batch=make_batch,
        loss_fn=loss_fn,
    )


def quick() -> Workload:
    """Finishes in well under a second of probing."""
    return _workload("quick")


def slow(*, delay: float = 0.2) -> Workload:
    """Sleeps ``delay`` seconds in every loss computation, so a profile takes seconds."""
    return _workload("slow", delay)


def hang() -> Workload:
    """Never finishes a step: only a timeout ends its profile."""
    return _workload("hang", 3600.0)


def exits() -> Workload:
    """Ends its own process with status 70 in the first step."""
    return _workload("exits", crash="exit")


def raises() -> Workload:
    """Raises an error that is not an out-of-memory in the first step."""
    return _workload("raises", crash="raise")
