"""Everything a probe may touch, saved once and put back after every probe.

Copies live on the host so that they never take device memory from the probe they
protect. Restoring writes values into the existing tensors and containers, so the
user's Parameter objects and the optimizer's references to them stay the same objects.
"""

from __future__ import annotations

import copy
import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu", copy=True)


@dataclass
class _SavedTensor:
    tensor: torch.Tensor
    device: torch.device

    @classmethod
    def of(cls, tensor: torch.Tensor) -> _SavedTensor:
        return cls(_host_copy(tensor), tensor.device)

    def materialize(self) -> torch.Tensor:
        return self.tensor.to(self.device, copy=True)


@dataclass
class TrainingState:
    """Parameters, buffers, gradients, optimizer state, RNG streams and train/eval flags."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    values: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    grads: list[tuple[nn.Parameter, _SavedTensor | None]] = field(default_factory=list)
    optimizer_state: dict[Any, dict[str, Any]] = field(default_factory=dict)
    param_groups: list[dict[str, Any]] = field(default_factory=list)
    training: list[tuple[nn.Module, bool]] = field(default_factory=list)
    rng: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def capture(cls, model: nn.Module, optimizer: torch.optim.Optimizer) -> TrainingState:
        state = cls(model=model, optimizer=optimizer)
        tensors = [*model.parameters(), *model.buffers()]
        state.values = [(t, _host_copy(t)) for t in tensors]
        state.grads = [
            (p, None if p.grad is None else _SavedTensor.of(p.grad)) for p in model.parameters()
        ]
        state.optimizer_state = {
            param: {key: _save_value(value) for key, value in entry.items()}
            for param, entry in optimizer.state.items()
        }
        state.param_groups = [
            {key: copy.deepcopy(value) for key, value in group.items() if key != "params"}
            for group in optimizer.param_groups
        ]
        state.training = [(module, module.training) for module in model.modules()]
        state.rng = _capture_rng()
        return state

    def restore(self) -> None:
        with torch.no_grad():
            for tensor, saved in self.values:
                tensor.copy_(saved)
        for param, grad in self.grads:
            param.grad = None if grad is None else grad.materialize()
        self.optimizer.state.clear()
        for param, entry in self.optimizer_state.items():
            self.optimizer.state[param] = {k: _load_value(v) for k, v in entry.items()}
        for group, saved_group in zip(self.optimizer.param_groups, self.param_groups, strict=True):
            for key in [k for k in group if k != "params" and k not in saved_group]:
                del group[key]
            group.update(copy.deepcopy(saved_group))
        for module, training in self.training:
            module.training = training
        _restore_rng(self.rng)


def _save_value(value: Any) -> Any:
    return _SavedTensor.of(value) if isinstance(value, torch.Tensor) else copy.deepcopy(value)


def _load_value(value: Any) -> Any:
    return value.materialize() if isinstance(value, _SavedTensor) else copy.deepcopy(value)


@contextmanager
def preserved_rng() -> Iterator[None]:
    """Run a block that may draw random numbers (a dataset's transforms, a collator that
    masks tokens) and put every RNG stream back afterwards: probing leaves the user's
    RNG as it found it."""
    rng = _capture_rng()
    try:
        yield
    finally:
        _restore_rng(rng)


def _capture_rng() -> dict[str, Any]:
    rng: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        rng["numpy"] = numpy.random.get_state()
    return rng


def _restore_rng(rng: dict[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if "cuda" in rng:
        torch.cuda.set_rng_state_all(rng["cuda"])
    if "numpy" in rng:
        sys.modules["numpy"].random.set_state(rng["numpy"])
