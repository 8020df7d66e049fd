"""The allocator's own count: every allocation and free of this process, on every thread.

Built on ``torch.profiler``'s memory events (``profile_memory=True``), torch's own record of
what its CPU allocator hands out and takes back, whichever thread asks (gloo's worker
threads among them, which carry the profiler's state with each collective they run) and
whatever asks (operators, ``UntypedStorage.resize_``, C++ code no dispatch mode sees).
After the block the events are replayed in time order; the running sum's maximum is the
most the block held above what was live when it began:

    peak = max over events e of  Σ_{e' ≤ e} size(e')      (frees are negative)

Why this and not the dispatch-mode tracker alone: the tracker (:mod:`.cpu`) sees the
operators of the thread that runs the step, which is what a GPU's caching allocator holds
(NCCL gathers into FSDP's own buffers). Gloo does not: its all-gather gathers into a
temporary of the output's size on a worker thread and copies out (``AsyncAllgatherWork``:
``flatOutputTensor = newLikeFlat(outputs[0])``, then ``outputs[j].copy_(…)``), and its
work objects hold a collective's tensors until the worker lets go of them.

One gap of the profiler: a worker thread that frees outside the profiler's reach leaves no
free event. Such a block is counted until its address is handed out again (it must have
been freed by then): never too little, and exact where every free is recorded (one
process and DDP agree with the tracker to the byte). The cost (the profiler records every
operator) is paid only on distributed CPU ranks, whose steps are timed apart anyway.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

# An allocation of this odd size, made inside the block by the thread that opened it, names
# that thread in the profiler's numbering (its own, not the operating system's).
_MARKER_BYTES = 12_347


@dataclass
class AllThreadCount:
    """Filled when the block exits. ``peak_bytes``: the most held above the start, every
    thread together. ``caller_peak_bytes``: the same for storages the calling thread
    allocated (freed by whichever thread). ``other_threads_allocations``: size → how many
    allocations other threads made."""

    peak_bytes: int = 0
    end_bytes: int = 0
    unrecorded_frees: int = 0
    caller_peak_bytes: int = 0
    other_threads_allocations: dict[int, int] = field(default_factory=dict)


@contextmanager
def all_thread_allocations() -> Iterator[AllThreadCount]:
    count = AllThreadCount()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        marker = torch.empty(_MARKER_BYTES, dtype=torch.uint8)
        del marker
        yield count
    events = sorted(
        (
            event
            for event in _walk(prof.profiler.kineto_results.experimental_event_tree())
            if event.tag == _EventType.Allocation and str(event.extra_fields.device) == "cpu"
        ),
        key=lambda event: event.start_time_ns,
    )
    caller = next(e.start_tid for e in events if e.extra_fields.alloc_size == _MARKER_BYTES)
    live: dict[int, tuple[int, bool]] = {}  # address -> (size, allocated by the caller)
    held = held_by_caller = 0
    for event in events:
        size, address = event.extra_fields.alloc_size, event.extra_fields.ptr
        if size > 0:
            earlier = live.pop(address, None)
            if earlier is not None:
                # Its free was not recorded (a thread let go of it outside the profiler's
                # reach): it happened before the address was handed out again, at the
                # latest now, which is where it is counted (never too little).
                count.unrecorded_frees += 1
                held -= earlier[0]
                held_by_caller -= earlier[0] if earlier[1] else 0
            by_caller = event.start_tid == caller
            live[address] = (size, by_caller)
            held += size
            held_by_caller += size if by_caller else 0
            if not by_caller:
                allocations = count.other_threads_allocations
                allocations[size] = allocations.get(size, 0) + 1
        else:
            freed = live.pop(address, None)
            held += size  # frees of storages from before the block count too
            if freed is not None and freed[1]:
                held_by_caller += size
        count.peak_bytes = max(count.peak_bytes, held)
        count.caller_peak_bytes = max(count.caller_peak_bytes, held_by_caller)
    count.end_bytes = held


def _walk(nodes: list[Any]) -> Iterator[Any]:
    for node in nodes:
        yield node
        yield from _walk(node.children)
