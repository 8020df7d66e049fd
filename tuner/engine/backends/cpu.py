"""The CPU backend: the bytes a step holds, counted against a limit.

It makes a CPU behave like a GPU of ``limit_bytes``. In one process the steps whose peak
decides M* are counted by the allocator's own hook (:mod:`.process_count`) with nothing
else active, as a training loop runs them: every block torch's CPU allocator hands out
counts until it is freed, and the allocation that would take the total over the limit
raises ``torch.OutOfMemoryError`` before it is made, as the CUDA allocator would. The
operator tracker (:class:`LiveBytesTracker`, a dispatch mode: every storage an operator
creates is counted until it is freed) counts the steps that gather details (the timeline
operator by operator), a dry run's fake steps, a rank's steps, and one process's where the
hook cannot be built. A mode changes the step it counts: autograd accumulates some
gradients out of place under any mode (where a gradient arrives from two places), copies
training never makes, so its count can be above the training's. Training on CPU and the
test suite use the backend to run the real search on real models.

The tracker sees the thread that runs the step, which is what a GPU holds. On a rank of a
gloo process group (``count_all_threads``) the process holds more: gloo gathers into
temporaries on its worker threads, allocates an output-sized buffer on the step's own
thread inside ``_allgather_base_`` and ``reduce_scatter_tensor_coalesced_`` (inside the
operator, where no dispatch mode sees it), and its work keeps a collective's tensors after
the step let them go. There each tracked block is also counted by every allocation and
free of the process, every thread (:mod:`.process_count`, a hook in front of torch's CPU
allocator; where it cannot be built, torch.profiler's events, :mod:`.allocations`); the
peak stays the tracker's (it stands for a GPU), and the reading's ``process_bytes``
carries the process's peak, which the limit is checked with:

    process bytes = live at the block's start + the most the process held above its start
"""

from __future__ import annotations

import gc
import os
import platform
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import partial
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from tuner.core.results import DeviceInfo
from tuner.core.units import format_bytes, limited_name
from tuner.engine.backends.allocations import AllThreadCount, all_thread_allocations
from tuner.engine.backends.base import (
    Backend,
    PeakReading,
    active_modes,
    plain_tensors,
)
from tuner.engine.backends.process_count import (
    COLLECTIVE,
    STEP,
    BlockCount,
    ProcessAllocations,
    process_allocations,
)
from tuner.engine.timeline import TimelineRecorder


class LiveBytesTracker(TorchDispatchMode):
    """Counts bytes of live tensor storages seen by operators; raises past ``limit_bytes``.

    A storage is counted from the first operator that creates or reads it until the
    storage is freed (a weakref callback). Tensors alive before the block are registered
    up front with :meth:`register` so that state an operator has not yet touched
    (optimizer moments during forward, say) still counts. A storage resized in place
    (FSDP frees and refills its all-gather buffers with ``UntypedStorage.resize_``, a call
    no operator sees) is re-counted at once: ``resize_`` is wrapped while a tracker is
    active.
    """

    _active: ClassVar[list[LiveBytesTracker]] = []
    _unwrapped_resize: ClassVar[Callable[..., Any] | None] = None
    # Whether each operator seen is a collective (c10d's), decided once per operator.
    _collective_ops: ClassVar[dict[Any, bool]] = {}

    def __init__(self, limit_bytes: int | None = None) -> None:
        super().__init__()
        self.limit_bytes = limit_bytes
        # Set where the process's allocations are counted by thread: entered around each
        # collective operator, so that what it allocates on this thread is told apart.
        self.collective_scope: Callable[[], AbstractContextManager[None]] | None = None
        self.live_bytes = 0
        self.peak_bytes = 0
        # Storage objects are preserved by torch for as long as the storage lives, so
        # their id is stable and the weakref fires exactly when the memory is freed.
        self._sizes: dict[int, int] = {}
        self._refs: dict[int, weakref.ref[Any]] = {}
        # Set while a block records its timeline: live bytes after each operator.
        self.timeline: TimelineRecorder | None = None

    def register(self, tensors: Iterable[torch.Tensor]) -> None:
        for tensor in tensors:
            self._count(tensor)
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes

    def _count(self, tensor: torch.Tensor) -> None:
        if type(tensor) is torch.Tensor or type(tensor) is nn.Parameter:  # the hot path
            self._count_storage(tensor)
            return
        for plain in plain_tensors(tensor):
            self._count_storage(plain)

    def __enter__(self) -> LiveBytesTracker:
        if not LiveBytesTracker._active:
            _watch_resizes()
        LiveBytesTracker._active.append(self)
        super().__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        super().__exit__(*exc_info)
        LiveBytesTracker._active.remove(self)
        if not LiveBytesTracker._active:
            _unwatch_resizes()

    def _count_storage(self, tensor: torch.Tensor) -> None:
        self._count_storage_object(tensor.untyped_storage())

    def _count_storage_object(self, storage: torch.UntypedStorage) -> None:
        key = id(storage)
        size = storage.nbytes()
        known = self._sizes.get(key)
        if known is None:
            self._sizes[key] = size
            self._refs[key] = weakref.ref(storage, self._forgetter(key))
            self.live_bytes += size
        elif known != size:  # resized in place
            self._sizes[key] = size
            self.live_bytes += size - known

    def _forgetter(self, key: int) -> Callable[[object], None]:
        def forget(_ref: object) -> None:
            self.live_bytes -= self._sizes.pop(key, 0)
            self._refs.pop(key, None)

        return forget

    def _count_all(self, values: Iterable[object]) -> None:
        for value in values:
            if isinstance(value, torch.Tensor):
                self._count(value)
            elif isinstance(value, list | tuple):
                for item in value:
                    if isinstance(item, torch.Tensor):
                        self._count(item)

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        self._count_all(args)
        self._count_all(kwargs.values())
        if self.collective_scope is not None and _is_collective(func):
            with self.collective_scope():
                out = func(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        self._count_all(out if isinstance(out, list | tuple) else (out,))
        # Checked on every operator, not only at a new peak: after a refused step the peak
        # may already be above the limit, and the next attempt must still be held to it.
        if self.limit_bytes is not None and self.live_bytes > self.limit_bytes:
            # Read the total before `del out` frees the refused storage and lowers it. As on
            # a GPU, the allocation that failed never existed: it does not count as the peak.
            live = self.live_bytes
            del out
            raise torch.OutOfMemoryError(
                f"CPU memory limit exceeded: {format_bytes(live)} live "
                f"after {func}, limit {format_bytes(self.limit_bytes)}"
            )
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
        if self.timeline is not None:
            self.timeline.after(self.live_bytes, func)
        return out


def _is_collective(func: Any) -> bool:
    known = LiveBytesTracker._collective_ops.get(func)
    if known is None:
        known = LiveBytesTracker._collective_ops[func] = getattr(func, "namespace", "") == "c10d"
    return known


def _watch_resizes() -> None:
    original = torch.UntypedStorage.resize_
    LiveBytesTracker._unwrapped_resize = original

    def resize_(storage: torch.UntypedStorage, size: int) -> Any:
        result = original(storage, size)
        for tracker in LiveBytesTracker._active:
            tracker._count_storage_object(storage)
            tracker.peak_bytes = max(tracker.peak_bytes, tracker.live_bytes)
            if tracker.timeline is not None:
                tracker.timeline.after(tracker.live_bytes, "UntypedStorage.resize_")
        return result

    torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign,assignment]


def _unwatch_resizes() -> None:
    if LiveBytesTracker._unwrapped_resize is not None:
        torch.UntypedStorage.resize_ = LiveBytesTracker._unwrapped_resize  # type: ignore[method-assign]
        LiveBytesTracker._unwrapped_resize = None


# Gloo runs a process group's collectives on two worker threads (its default), so at most
# two of its temporaries are alive at once.
GLOO_WORKER_THREADS = 2


def process_peak(tracker_peak: int, live_at_start: int, all_threads: AllThreadCount) -> int:
    """What the process may hold at its peak, every thread counted:

        max(live at start + the allocator's measured peak,
            tracker peak + the GLOO_WORKER_THREADS largest allocations of other threads)

    The first is what this block's steps held; the second is why it is not enough: when a
    gloo temporary is alive depends on its worker's timing (measured: the same step held
    0 or 4.2 MB more than the tracker from run to run), so the step thread's peak is taken
    to meet the largest temporaries that can be alive together. Where no other thread
    allocates (one process, DDP) both are the tracker's peak, to the byte."""
    largest = sorted(
        (
            size
            for size, times in all_threads.other_threads_allocations.items()
            for _ in range(min(times, GLOO_WORKER_THREADS))
        ),
        reverse=True,
    )[:GLOO_WORKER_THREADS]
    return max(live_at_start + all_threads.peak_bytes, tracker_peak + sum(largest))


class CpuBackend(Backend):
    """Runs probes on the CPU against a memory limit of the user's choosing."""

    kind = "cpu"
    tracking_slows_steps = True
    # Whether one process's blocks are counted by the allocator's hook, with no mode (a
    # dry run's fake tensors allocate nothing there: its backend counts with the tracker).
    counts_plain_steps: ClassVar[bool] = True

    def __init__(self, limit_bytes: int, *, count_all_threads: bool = False) -> None:
        if limit_bytes <= 0:
            raise ValueError("the CPU memory limit must be positive")
        self.device = torch.device("cpu")
        self.capacity_bytes = limit_bytes
        self.memory_limit_bytes = limit_bytes
        # Set on ranks of a gloo group, where threads other than the step's allocate.
        self.count_all_threads = count_all_threads
        # The exact count of every thread's allocations, installed now (before the
        # workload is built, so that what its steps free was counted when allocated);
        # None where it cannot be built, and torch.profiler's events count instead.
        self.process_count: ProcessAllocations | None = (
            process_allocations() if count_all_threads else None
        )
        if self.process_count is not None:
            # This thread runs the steps: what it allocates in set-up (the model, its shards)
            # is the step's, so that a block's count can tell it from gloo's threads' blocks.
            self.process_count.tag_this_thread(STEP)
        # One process: the exact count alone, with no dispatch mode on the steps whose
        # peak decides M* (a mode makes autograd accumulate some gradients out of place:
        # measured +6.8% on Mamba). None where it cannot be built: the tracker counts.
        self.plain_count: ProcessAllocations | None = (
            process_allocations() if self.counts_plain_steps and not count_all_threads else None
        )
        if self.plain_count is not None:
            self.tracking_slows_steps = False  # a hook per allocation: steps are timed as run
        # Allocations from this serial number on, still alive at a block's start, are the
        # workload's (start_workload); before it, only the resident tensors are.
        self._workload_serial = self.plain_count.serial() if self.plain_count else 0
        # Inside a plain block: what the workload held at its start, and the process's
        # live bytes then (current_bytes and end_phase read from them).
        self._plain_start: tuple[int, int] | None = None
        self._tracker: LiveBytesTracker | None = None
        # One tracker for a whole session: storages it has seen stay counted while they
        # live, also those made in set-up (``observe``) or in an earlier block that no
        # Python object of ours points to (DDP's buckets, rebuilt in the first steps).
        self._session_tracker: LiveBytesTracker | None = None

    def describe(self) -> DeviceInfo:
        return DeviceInfo(
            kind=self.kind,
            # Each limit is its own device: the name says which.
            name=limited_name(
                platform.processor() or platform.machine() or "cpu", self.capacity_bytes
            ),
            capacity_bytes=self.capacity_bytes,
            details={
                "memory_limit_bytes": self.capacity_bytes,
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "cpus": os.cpu_count(),
            },
        )

    def key_fields(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "memory_limit_bytes": self.capacity_bytes,
            "torch": torch.__version__.split("+")[0],
        }

    @contextmanager
    def session(self) -> Iterator[None]:
        self._session_tracker = LiveBytesTracker()
        try:
            yield
        finally:
            self._session_tracker = None

    @contextmanager
    def observe(self) -> Iterator[None]:
        if self._session_tracker is None:
            yield  # outside a session nothing carries over to later probes anyway
            return
        with self._session_tracker:
            yield

    def start_workload(self) -> None:
        if self.plain_count is not None:
            self._workload_serial = self.plain_count.serial()

    def counts_plain(self, *, detail: bool = False, timeline: bool = False) -> bool:
        """Whether a block is counted by the allocator's hook alone, with no mode: one
        process, the hook built, the block not one for details, and no dispatch mode
        active already (a fake world's, which watches its collectives; a dry run's)."""
        return self.plain_count is not None and not (detail or timeline) and not active_modes()

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
        limit = int(self.capacity_bytes * stop_at) if enforce_capacity else None
        if self.counts_plain(detail=detail, timeline=timeline):
            with self._track_plain(resident, limit) as reading:
                yield reading
            return
        reading = PeakReading()
        tracker = self._session_tracker
        if tracker is None:
            tracker = LiveBytesTracker(limit)
        else:
            # Garbage in reference cycles still holds storages the tracker counts as live.
            # The young generations only: the last block's garbage is there, and a full
            # collection over torch's heap costs ~0.2 s a block (measured: 10× slower tests).
            gc.collect(1)
            tracker.limit_bytes = limit
        tracker.register(resident)
        tracker.reset_peak()
        live_at_start = tracker.live_bytes
        # The tracker's peak is the largest of these same samples: the timeline's peak is
        # the reading's allocated peak, to the byte.
        tracker.timeline = TimelineRecorder(live_at_start) if timeline else None
        self._tracker = tracker
        counting: AbstractContextManager[BlockCount | AllThreadCount | None] = nullcontext()
        if self.process_count is not None:
            counting = self.process_count.block()
            tracker.collective_scope = partial(self.process_count.tagged, COLLECTIVE)
        elif self.count_all_threads:
            counting = all_thread_allocations()
        try:
            with counting as all_threads, tracker:
                yield reading
        finally:
            self._tracker = None
            tracker.limit_bytes = None
            tracker.collective_scope = None
            recorder, tracker.timeline = tracker.timeline, None
        reading.add(tracker.peak_bytes, tracker.peak_bytes)
        if recorder is not None:
            reading.timeline = recorder.timeline()
        if isinstance(all_threads, BlockCount):
            # The tracker's live bytes at the start stand for the step thread's blocks then.
            held = live_at_start + all_threads.peak_bytes
        elif isinstance(all_threads, AllThreadCount):
            held = process_peak(reading.reserved_bytes, live_at_start, all_threads)
        else:
            return
        # The block's peak over its phases (end_phase restarts the tracker's).
        reading.process_bytes = max(reading.process_bytes, held)

    @contextmanager
    def _track_plain(
        self, resident: Iterable[torch.Tensor], limit: int | None
    ) -> Iterator[PeakReading]:
        """A block counted by the allocator's hook with nothing else active:

            peak = held at start + (the process's peak in the block − its live bytes at start)
            held at start = live blocks this thread allocated in blocks since start_workload
                            + the resident tensors not among them (the weights, the batch)

        An allocation of this thread that would take the count past ``limit`` raises
        ``torch.OutOfMemoryError`` before it is made."""
        count = self.plain_count
        assert count is not None  # counts_plain said so
        # Garbage in reference cycles (the last block's) still holds blocks: the young
        # generations only, as the tracker does.
        gc.collect(1)
        reading = PeakReading()
        held = self._held_bytes(count, resident)
        count.push()
        try:
            live = count.read().live_bytes
            self._plain_start = (held, live)
            cap = None if limit is None else live + limit - held
            with count.tagged(STEP), count.limited(cap):
                yield reading
            peak = held + count.read().peak_bytes - live
        finally:
            self._plain_start = None
            count.pop()
        reading.add(peak, peak)

    def _held_bytes(self, count: ProcessAllocations, resident: Iterable[torch.Tensor]) -> int:
        """What the workload holds now: the live blocks its steps allocated since
        start_workload (inside blocks, where this thread is tagged as the step's: not what
        other work of the process, a dry run say, allocates in between), and the resident
        tensors' storages that are not among them (the weights, the batch, gradients and
        state put back between probes)."""
        since = self._workload_serial
        others: dict[int, int] = {}
        for tensor in resident:
            for plain in plain_tensors(tensor):
                storage = plain.untyped_storage()
                address = storage.data_ptr()
                if address and count.serial_of(address, STEP) < since:
                    others[address] = storage.nbytes()
        return count.live_since(since, STEP) + sum(others.values())

    def current_bytes(self) -> int:
        if self._plain_start is not None and self.plain_count is not None:
            held, live = self._plain_start
            return held + self.plain_count.read().live_bytes - live
        if self._tracker is None:
            raise RuntimeError("current_bytes is only meaningful inside track()")
        return self._tracker.live_bytes

    def end_phase(self, reading: PeakReading, phase: str) -> None:
        if self._plain_start is not None and self.plain_count is not None:
            held, live = self._plain_start
            peak = held + self.plain_count.read().peak_bytes - live
            reading.add(peak, peak, phase)
            # The next phase's peak starts from what is live now.
            self.plain_count.pop()
            self.plain_count.push()
            return
        if self._tracker is None:
            raise RuntimeError("end_phase is only meaningful inside track()")
        reading.add(self._tracker.peak_bytes, self._tracker.peak_bytes, phase)
        self._tracker.reset_peak()
        if self._tracker.timeline is not None:
            self._tracker.timeline.mark(phase)
