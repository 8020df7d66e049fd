"""Where a step's peak is: the activations each block saves for backward, and the phase
(forward, backward, optimizer step) in which the peak falls. The blocks are the model's
children, with nested layer lists opened (:func:`top_level_blocks`).

Forward hooks on the blocks say which block is running; a saved-tensors hook
sees every tensor autograd keeps for backward and files its storage under that block (the
first block to save a storage owns it; parameters and buffers are resident, not
activations). At the end of forward the bytes of the storages still alive are summed per
block: that is what backward starts from, the largest the activations get. A block run
under non-reentrant activation checkpointing saves through the checkpoint's own hook, so
it shows only what it keeps outside it.

The hooks cost one Python call per saved tensor and two per block, once per forward of a
measured step, small next to the step itself (see README, "Where the peak is").
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from tuner.core.phases import PEAK_PHASES, PeakPhase
from tuner.core.results import OUTSIDE_BLOCKS
from tuner.engine.backends import PeakReading
from tuner.engine.backends.base import plain_tensors


def top_level_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's children, with a ``ModuleList`` or ``ModuleDict`` (never called itself)
    opened into its members (``blocks.0``, ``blocks.1``, ...), and a child that holds such
    a list opened into its own children, so that the layers of a wrapped stack are named
    (a transformers causal LM: ``model.embed_tokens``, ``model.layers.0``, ...,
    ``model.norm``, ``lm_head``). A list's members are blocks themselves, never opened."""
    return _blocks(model, "")


def _blocks(module: nn.Module, prefix: str) -> list[tuple[str, nn.Module]]:
    blocks: list[tuple[str, nn.Module]] = []
    for name, child in module.named_children():
        path = f"{prefix}{name}"
        if isinstance(child, nn.ModuleList | nn.ModuleDict):
            blocks.extend((f"{path}.{member}", block) for member, block in child.named_children())
        elif _holds_a_list(child):
            blocks.extend(_blocks(child, f"{path}."))
        else:
            blocks.append((path, child))
    return blocks


def _holds_a_list(module: nn.Module) -> bool:
    return any(isinstance(m, nn.ModuleList | nn.ModuleDict) for m in module.modules())


class BlockActivations:
    """Bytes saved for backward per top-level block of ``model``, the largest over the
    forwards run inside :meth:`forward`."""

    def __init__(self, model: nn.Module) -> None:
        self._blocks = top_level_blocks(model)
        resident = [*model.parameters(), *model.buffers()]
        self._resident = {
            id(plain.untyped_storage()) for t in resident for plain in plain_tensors(t)
        }
        self._current: str | None = None
        # Weak references: holding a storage would keep it past backward and move the peak.
        self._saved: dict[int, tuple[str, weakref.ref[torch.UntypedStorage]]] = {}
        self.bytes_by_block: dict[str, int] = {}

    @contextmanager
    def forward(self) -> Iterator[None]:
        """Watch one forward (the loss included); fold its saved bytes in when it ends."""
        handles = []
        for name, block in self._blocks:
            handles.append(block.register_forward_pre_hook(self._enter(name)))
            handles.append(block.register_forward_hook(self._leave))
        self._saved.clear()
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack):
                yield
        finally:
            for handle in handles:
                handle.remove()
            self._current = None
        self._fold()

    def _enter(self, name: str) -> Any:
        def enter(_module: nn.Module, _args: object) -> None:
            self._current = name

        return enter

    def _leave(self, _module: nn.Module, _args: object, _output: object) -> None:
        self._current = None

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        for plain in plain_tensors(tensor):
            if plain.layout is not torch.strided:
                continue  # sparse and nested tensors have no single storage to name
            storage = plain.untyped_storage()
            key = id(storage)
            if key not in self._saved and key not in self._resident:
                self._saved[key] = (self._current or OUTSIDE_BLOCKS, weakref.ref(storage))
        return tensor

    def _fold(self) -> None:
        totals = dict.fromkeys((name for name, _ in self._blocks), 0)
        for owner, ref in self._saved.values():
            storage = ref()
            if storage is not None:  # nbytes now: FSDP empties its gathered weights in place
                totals[owner] = totals.get(owner, 0) + storage.nbytes()
        self._saved.clear()
        for name, size in totals.items():
            if size or name != OUTSIDE_BLOCKS:
                self.bytes_by_block[name] = max(self.bytes_by_block.get(name, 0), size)


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def peak_phase(phases: PeakReading) -> PeakPhase | None:
    """The phase with the highest allocated peak (the earlier one on a tie), from a
    reading whose phases are named after :data:`tuner.core.phases.PEAK_PHASES`."""
    measured = [
        (phases.phases[name], -index, name)
        for index, name in enumerate(PEAK_PHASES)
        if name in phases.phases
    ]
    if not measured:
        return None
    return max(measured)[2]  # type: ignore[return-value]
