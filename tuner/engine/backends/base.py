"""How a probe's memory is measured: the interface both backends implement."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from tuner.core.results import DeviceInfo
from tuner.core.timeline import MemoryTimeline


@dataclass
class PeakReading:
    """Peaks of a ``Backend.track`` block, complete when the block exits normally.

    ``phases`` holds the allocated peak of each named phase of a step (the largest over
    the block's steps), as marked with ``Backend.end_phase``.
    """

    allocated_bytes: int = 0
    reserved_bytes: int = 0
    alloc_retries: int = 0
    phases: dict[str, int] = field(default_factory=dict)
    # On the CPU under gloo: what the process's allocator held at its peak, every thread
    # counted (gloo's own copies among it); 0 where not measured apart.
    process_bytes: int = 0
    # Live bytes over the block, when ``track`` was asked to record them.
    timeline: MemoryTimeline | None = None

    @property
    def collective_copies_bytes(self) -> int:
        """What the process held beyond ``reserved_bytes``, the figure a GPU would hold."""
        return max(0, self.process_bytes - self.reserved_bytes)

    def add(self, allocated: int, reserved: int, phase: str | None = None) -> None:
        self.allocated_bytes = max(self.allocated_bytes, allocated)
        self.reserved_bytes = max(self.reserved_bytes, reserved)
        if phase is not None:
            self.phases[phase] = max(self.phases.get(phase, 0), allocated)


class Backend(ABC):
    """A device with a capacity, and a way to read the peak memory of a block of work."""

    kind: str
    device: torch.device
    capacity_bytes: int
    # The limit the user set (the CPU's memory, or a smaller card emulated on CUDA).
    memory_limit_bytes: int | None = None
    # True when tracking slows each step (the CPU tracker intercepts every operator), so
    # throughput must be timed on separate, untracked steps.
    tracking_slows_steps: bool = False

    @abstractmethod
    def describe(self) -> DeviceInfo:
        """Name, capacity and details for people and for the device key."""

    @abstractmethod
    def key_fields(self) -> dict[str, object]:
        """Everything about this device that changes how much memory a step takes."""

    @abstractmethod
    def track(
        self,
        resident: Iterable[torch.Tensor],
        *,
        enforce_capacity: bool = True,
        stop_at: float = 1.0,
        timeline: bool = False,
        detail: bool = False,
    ) -> AbstractContextManager[PeakReading]:
        """Measure the peak inside the block. ``resident`` lists tensors alive before it
        (weights, gradients, optimizer state) so that a backend that only sees new
        allocations can count them. Going over ``stop_at`` times the capacity raises an
        out-of-memory error, unless ``enforce_capacity`` is false and the backend can
        lift it (a backend that can measure past its capacity may stop later than 1×).
        With ``timeline``, the reading also carries live bytes over the block
        (:mod:`tuner.engine.timeline`), its phases marked by ``end_phase``.

        Without ``detail`` (and ``timeline``) the block is one whose peak decides ``M*``:
        nothing that changes what autograd allocates (a dispatch mode, a hook) may be
        active in it, and a backend counts it without one. With ``detail`` the block
        gathers what needs a mode or hooks (the timeline operator by operator, the blocks'
        saved activations); its peak may differ from the training's."""

    @abstractmethod
    def end_phase(self, reading: PeakReading, phase: str) -> None:
        """Inside ``track``: fold the peak since the last phase into ``reading`` under
        ``phase`` and start the next phase's peak from the memory live now."""

    def non_torch_bytes(self) -> int:
        """Memory of this device held outside torch's allocator right now."""
        return 0

    def synchronize(self) -> None:
        """Wait for queued work, so that timings and peaks are complete."""

    def release_cached(self) -> None:
        """Return cached, unused blocks to the device: before each probe, so that its
        reserved peak is its own, and after an out-of-memory."""

    def start_workload(self) -> None:
        """The prober holds the workload now (its copies of the user's state made): what
        is allocated from here on and still alive when a block starts is the workload's
        (gradients, optimizer state, a cache a model keeps between steps)."""

    def session(self) -> AbstractContextManager[None]:
        """Settings held for a whole profile (a CUDA memory cap, say)."""
        return nullcontext()

    def observe(self) -> AbstractContextManager[None]:
        """Inside ``session``: set-up work whose allocations must count in every later
        probe (DDP's gradient buckets, made when the model is wrapped). The CUDA
        allocator sees everything anyway; the CPU tracker must be watching."""
        return nullcontext()

    @abstractmethod
    def current_bytes(self) -> int:
        """Inside ``track``: the bytes allocated right now."""


def active_modes() -> list[str]:
    """What is active on this thread that changes what autograd allocates: dispatch modes
    (by class name) and saved-tensor hooks. Nothing, around a step as a training loop runs
    it."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    active = [type(mode).__name__ for mode in _get_current_dispatch_mode_stack()]
    if torch._C._autograd._top_saved_tensors_default_hooks(False) is not None:
        active.append("saved-tensor hooks")
    return active


def plain_tensors(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """The tensors that hold memory: ``tensor`` itself, or for a wrapper subclass such as
    FSDP's sharded ``DTensor`` (whose own storage is a stand-in of the global size) the
    tensors inside it, this rank's shard."""
    wrapper: Any = tensor
    if type(tensor) is torch.Tensor or not is_traceable_wrapper_subclass(wrapper):
        yield tensor
        return
    names, _ = wrapper.__tensor_flatten__()
    for name in names:
        inner = getattr(wrapper, name)
        if isinstance(inner, torch.Tensor):  # DTensor also names its (tensor-free) mesh
            yield from plain_tensors(inner)


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (tied weights count once)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        for plain in plain_tensors(tensor):
            storage = plain.untyped_storage()
            # A fake tensor's storage has no address (a dry run's, tuner.engine.dry_run).
            address = 0 if isinstance(plain, FakeTensor) else storage.data_ptr()
            seen[address or id(storage)] = storage.nbytes()
    return sum(seen.values())


def iter_tensors(obj: object) -> Iterator[torch.Tensor]:
    """Tensors inside nested dicts, lists and tuples (optimizer state, for one)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from iter_tensors(value)
    elif isinstance(obj, list | tuple):
        for item in obj:
            yield from iter_tensors(item)
