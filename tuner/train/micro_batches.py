"""One micro batch's loss and outputs, as the accumulator reads them.

A loss function returns either the **mean** over its loss units (the usual
``F.cross_entropy(..., ignore_index=-100)``; the units are counted by ``loss_units``)
or the pair **(sum, count)**: the sum over its units and how many there were, so that
the count can never disagree with the loss (a causal shift, a mask applied inside).

A micro batch with no units has a mean of 0/0: its value is NaN and so is every
gradient its backward produces. When that backward must still run (it carries a
collective every rank has to join), :class:`ForwardWatch` replaces the gradient arriving
at the model's outputs with zeros, so nothing reaches the parameters but zeros.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from tuner.core.errors import BadInputError
from tuner.engine.batching import Batch, batch_tensors, map_tensors

KeepOutputs = bool | Callable[[Any, Batch], Any]


@dataclass(frozen=True)
class LossValue:
    """What backward differentiates, and (for a ``(sum, count)`` loss) its unit count."""

    value: torch.Tensor
    count: torch.Tensor | int | None  # None: a mean, weighted by ``loss_units``


def read_loss(result: object) -> LossValue:
    """The loss function's result as a mean or as ``(sum, count)``; anything else is refused."""
    if isinstance(result, torch.Tensor) and result.numel() == 1:
        # A view only when needed: each is one more node in the backward.
        return LossValue(result if result.dim() == 0 else result.reshape(()), None)
    if (
        isinstance(result, tuple | list)
        and len(result) == 2
        and isinstance(result[0], torch.Tensor)
        and result[0].numel() == 1
        and isinstance(result[1], torch.Tensor | int)
    ):
        return LossValue(result[0].reshape(()), result[1])
    raise BadInputError(
        "loss_fn must return a scalar tensor (the mean over its loss units) or a pair "
        f"(sum, count); it returned {type(result).__name__}"
    )


def count_units(value: object) -> int:
    """A unit count as a Python int (``loss_units`` may return a tensor)."""
    count = int(value.item()) if isinstance(value, torch.Tensor) else int(value)  # type: ignore[call-overload]
    if count < 0:
        raise BadInputError(f"loss units must be counted, >= 0; got {count}")
    return count


@dataclass
class ForwardWatch:
    """Hooks on the model's forward for one micro batch, installed only when needed."""

    zero_gradients: bool = False  # the micro batch has no units but its backward must run
    keep: KeepOutputs = False
    part: Batch = None
    kept: Any = field(default=None, init=False)

    @property
    def needed(self) -> bool:
        return self.zero_gradients or bool(self.keep)

    @contextmanager
    def around(self, model: nn.Module) -> Iterator[ForwardWatch]:
        if not self.needed:
            yield self
            return
        handle = model.register_forward_hook(self._after_forward)
        try:
            yield self
        finally:
            handle.remove()

    def _after_forward(self, module: nn.Module, inputs: Any, outputs: Any) -> None:
        if self.zero_gradients:
            for _, tensor in batch_tensors(outputs):
                if tensor.requires_grad:
                    tensor.register_hook(torch.zeros_like)  # type: ignore[no-untyped-call]
        if self.keep:
            detached = map_tensors(outputs, torch.Tensor.detach)
            self.kept = self.keep(detached, self.part) if callable(self.keep) else detached
