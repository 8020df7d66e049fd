"""What an out-of-memory leaves behind, put back so that a retry is exact.

Two things change before a failure and would otherwise be counted twice by the retry:

- **Running statistics** (BatchNorm, InstanceNorm with ``track_running_stats``): every
  training forward updates them, so the micro batches of a failed attempt would be
  counted again by the retry. :class:`RunningStats` copies them at the start of a step
  (a few kilobytes) and puts them back before each retry.
- **The optimizer step**: its state (Adam's two moments: twice the parameters) is
  allocated lazily, so the first step is where it most often runs out of memory.
  :func:`step_optimizer` frees what it can and steps again, once, but only when the
  failed step changed nothing that the retry would change again. Whether it did is read
  from the tensors' version counters (bumped by every in-place write), so no copy of the
  parameters is needed: state created by the failed step and not yet written is dropped
  and made again; any parameter or older state already written makes a retry inexact,
  and the error says so instead.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase

from tuner.core.units import format_bytes
from tuner.engine.backends import is_out_of_memory


class OptimizerOutOfMemoryError(torch.OutOfMemoryError):
    """The optimizer step ran out of memory and could not be redone."""


@dataclass
class RunningStats:
    """The running statistics of every normalization layer that tracks them, found once
    (a model's layers do not change between steps); :meth:`capture` copies them."""

    buffers: list[tuple[nn.Module, torch.Tensor]]

    @classmethod
    def of(cls, model: nn.Module) -> RunningStats:
        return cls(
            [
                (module, buffer)
                for module in model.modules()
                if isinstance(module, _NormBase) and module.track_running_stats
                for buffer in module.buffers(recurse=False)
            ]
        )

    def capture(self) -> SavedStats:
        # Only layers in training mode update their statistics.
        return SavedStats([(b, b.detach().clone()) for m, b in self.buffers if m.training])


@dataclass
class SavedStats:
    saved: list[tuple[torch.Tensor, torch.Tensor]]

    def restore(self) -> None:
        with torch.no_grad():
            for buffer, copy in self.saved:
                buffer.copy_(copy)


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def step_optimizer(optimizer: torch.optim.Optimizer, step: Callable[[], object]) -> None:
    """Run ``step`` (``optimizer.step``, or the GradScaler's); after an out-of-memory,
    free memory and run it once more if the failed attempt can be undone exactly."""
    before = _versions(optimizer)
    try:
        step()
        return
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        message = _first_line(exc)
    written = _undo_fresh_state(optimizer, before)
    free_memory()
    if written:
        raise OptimizerOutOfMemoryError(
            f"out of memory in optimizer.step ({message}) after it had already updated "
            f"{written} tensors, so it cannot be redone exactly; {_sizes(optimizer)}"
        )
    try:
        step()
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        free_memory()
        raise OptimizerOutOfMemoryError(
            f"out of memory in optimizer.step twice ({_first_line(exc)}); {_sizes(optimizer)}"
        ) from None


def _versions(optimizer: torch.optim.Optimizer) -> dict[int, int]:
    """The version counter of every parameter and every state tensor, by identity."""
    return {id(tensor): tensor._version for tensor in _tensors(optimizer)}


def _tensors(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    for group in optimizer.param_groups:
        yield from group["params"]
    for state in optimizer.state.values():
        yield from (value for value in state.values() if isinstance(value, torch.Tensor))


def _undo_fresh_state(optimizer: torch.optim.Optimizer, before: dict[int, int]) -> int:
    """Drop state the failed step created but never wrote (so the retry creates it again,
    as if for the first time); return how many tensors it did write, which cannot be
    undone."""
    written = 0
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            if parameter._version != before.get(id(parameter), parameter._version):
                written += 1
            state = optimizer.state.get(parameter)
            if not state:
                continue
            tensors = [v for v in state.values() if isinstance(v, torch.Tensor)]
            fresh = [t for t in tensors if id(t) not in before]
            old = [t for t in tensors if id(t) in before]
            written += sum(t._version != before[id(t)] for t in old)
            if fresh and not old and all(t._version == 0 for t in fresh):
                del optimizer.state[parameter]
            elif fresh and not old:
                written += sum(t._version != 0 for t in fresh)
    return written


def _sizes(optimizer: torch.optim.Optimizer) -> str:
    parameters = sum(
        p.numel() * p.element_size() for group in optimizer.param_groups for p in group["params"]
    )
    state = sum(
        value.numel() * value.element_size()
        for entry in optimizer.state.values()
        for value in entry.values()
        if isinstance(value, torch.Tensor)
    )
    return (
        f"the optimizer holds {format_bytes(state)} of state for {format_bytes(parameters)} of "
        "parameters: use a lighter optimizer (SGD, Adafactor, an 8-bit Adam), shard its state "
        "(FSDP), or a device with more memory"
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "out of memory"
