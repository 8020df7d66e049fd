"""The CUDA backend: peaks from torch's caching allocator, as DESIGN.md's protocol says.

Fits when ``reserved peak + non-torch ≤ (1 − headroom) × capacity`` and the allocator
needed no retries (a retry means it had to free its cache to satisfy a request: the size
works only by thrashing, and a slightly longer sequence would not).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch

from tuner.core.errors import DeviceUnavailableError
from tuner.core.results import DeviceInfo
from tuner.core.timeline import MemoryTimeline
from tuner.core.units import limited_name
from tuner.engine.backends.base import Backend, PeakReading, active_modes
from tuner.engine.timeline import CUDA_HISTORY_EVENTS, timeline_from_trace


class CudaBackend(Backend):
    """Probes on one CUDA device; an optional ``limit_bytes`` emulates a smaller GPU."""

    kind = "cuda"

    def __init__(self, index: int | None = None, *, limit_bytes: int | None = None) -> None:
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(
                "--device cuda was asked for but torch sees no CUDA device: "
                "use --device cpu with --memory-limit, or install a CUDA build of torch"
            )
        self.device = torch.device("cuda", torch.cuda.current_device() if index is None else index)
        self._props = torch.cuda.get_device_properties(self.device)
        self.total_bytes = int(self._props.total_memory)
        self.limit_bytes = limit_bytes
        self.memory_limit_bytes = limit_bytes
        self.capacity_bytes = min(self.total_bytes, limit_bytes or self.total_bytes)
        # While a block records its timeline: the allocator's event count at its start, and
        # the count at the end of each phase (``_allocator_events``).
        self._history_start: int | None = None
        self._phase_marks: list[tuple[str, int]] = []

    def describe(self) -> DeviceInfo:
        return DeviceInfo(
            kind=self.kind,
            # Under a limit below the card's memory, a device of its own: the name says so.
            name=limited_name(
                self._props.name,
                self.limit_bytes if self.capacity_bytes < self.total_bytes else None,
            ),
            capacity_bytes=self.capacity_bytes,
            details={
                "total_memory_bytes": self.total_bytes,
                "memory_limit_bytes": self.limit_bytes,
                "compute_capability": f"{self._props.major}.{self._props.minor}",
                "torch": torch.__version__,
                "cuda": torch.version.cuda,
                "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            },
        )

    def key_fields(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "name": self._props.name,
            "total_memory_bytes": self.total_bytes,
            "memory_limit_bytes": self.limit_bytes,
            "compute_capability": f"{self._props.major}.{self._props.minor}",
            "torch": torch.__version__.split("+")[0],
            "cuda": torch.version.cuda,
            # The allocator's settings (expandable segments, say) change reserved peaks.
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        }

    @contextmanager
    def session(self) -> Iterator[None]:
        if self.limit_bytes is None or self.limit_bytes >= self.total_bytes:
            yield
            return
        # The allocator itself refuses to grow past the limit, as a smaller card would.
        torch.cuda.set_per_process_memory_fraction(self.limit_bytes / self.total_bytes, self.device)
        try:
            yield
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, self.device)

    def non_torch_bytes(self) -> int:
        """``total − free − reserved``: the CUDA context, NCCL and other processes."""
        free, total = torch.cuda.mem_get_info(self.device)
        reserved = torch.cuda.memory_reserved(self.device)
        return max(0, int(total - free - reserved))

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def release_cached(self) -> None:
        gc.collect()
        torch.cuda.empty_cache()

    @contextmanager
    def track(
        self,
        resident: Iterable[torch.Tensor],
        *,
        enforce_capacity: bool = True,
        stop_at: float = 1.0,
        timeline: bool = False,
        detail: bool = False,
    ) -> Iterator[PeakReading]:
        # The allocator already knows every live block; a physical card cannot be lifted.
        del resident, enforce_capacity, stop_at  # the device itself stops at its memory
        modes = active_modes()
        if modes and not detail:
            # Under a mode autograd accumulates some gradients out of place: the peak read
            # would be the mode's, not the training's (DESIGN.md, "Count the step").
            raise RuntimeError(
                f"{', '.join(modes)} active around a measured step: max_memory_allocated "
                "would count what they make autograd allocate, not the training's step; "
                "measure the step with no dispatch mode or saved-tensor hooks active"
            )
        reading = PeakReading()
        self.synchronize()
        gc.collect()
        torch.cuda.reset_peak_memory_stats(self.device)
        retries_before = torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0)
        # A memory history the user is recording is theirs: never cleared nor turned off.
        timeline = timeline and not _history_enabled()
        start_bytes = torch.cuda.memory_allocated(self.device) if timeline else 0
        if timeline:
            self._start_history()
        try:
            yield reading
            self.synchronize()
            if timeline:
                reading.timeline = self._timeline(start_bytes)
        finally:
            if timeline:
                self._stop_history()
        reading.add(
            torch.cuda.max_memory_allocated(self.device),
            torch.cuda.max_memory_reserved(self.device),
        )
        retries = torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0)
        reading.alloc_retries = int(retries - retries_before)

    def _start_history(self) -> None:
        """torch's memory history from here on: every allocation and free with its Python
        frames (the C++ ones cost more and name no more), at most CUDA_HISTORY_EVENTS."""
        torch.cuda.memory._record_memory_history(
            "all",
            context="alloc",
            stacks="python",
            max_entries=CUDA_HISTORY_EVENTS,
            clear_history=True,
        )
        self._history_start = self._allocator_events()
        self._phase_marks = []

    def _stop_history(self) -> None:
        torch.cuda.memory._record_memory_history(None)
        self._history_start = None
        self._phase_marks = []

    def _allocator_events(self) -> int:
        """Allocations and frees so far: the trace's ``alloc`` and ``free_requested``
        entries, counted by the allocator's own statistics, which change at the same calls."""
        stats = torch.cuda.memory_stats(self.device)
        return int(stats.get("allocation.all.allocated", 0) + stats.get("allocation.all.freed", 0))

    def _timeline(self, start_bytes: int) -> MemoryTimeline | None:
        if self._history_start is None:
            return None
        snapshot = torch.cuda.memory._snapshot(self.device)
        traces = snapshot.get("device_traces") or []
        index = self.device.index or 0
        trace = traces[index] if index < len(traces) else []
        start = self._history_start
        return timeline_from_trace(
            trace,
            start_bytes=start_bytes,
            expected_events=self._allocator_events() - start,
            marks=[(phase, at - start) for phase, at in self._phase_marks],
        )

    def current_bytes(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def end_phase(self, reading: PeakReading, phase: str) -> None:
        # No synchronize: the caching allocator keeps its statistics on the host, in the
        # order kernels are queued, so they are exact without waiting for the device (a
        # wait here, four times a step, would stall the queue and slow the timed step).
        reading.add(
            torch.cuda.max_memory_allocated(self.device),
            torch.cuda.max_memory_reserved(self.device),
            phase,
        )
        torch.cuda.reset_peak_memory_stats(self.device)
        if self._history_start is not None:
            self._phase_marks.append((phase, self._allocator_events()))


def _history_enabled() -> bool:
    """Whether torch's memory history is being recorded already (by the user's own code).
    CUDA builds of torch have the query; where it is missing nothing can be recording."""
    enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    return bool(enabled()) if enabled is not None else False
