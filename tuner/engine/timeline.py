"""Recording a step's memory timeline (:mod:`tuner.core.timeline`) on each backend.

On the CPU the tracker (:class:`tuner.engine.backends.cpu.LiveBytesTracker`) already sees
every operator; it hands :class:`TimelineRecorder` its live bytes after each one. The peak
the tracker reads is the highest of those same values (and of the bytes live at the start),
so the timeline's peak is the probe's allocated peak, to the byte.

On CUDA torch's memory history records every allocation and free
(``torch.cuda.memory._record_memory_history``); :func:`timeline_from_trace` replays the
snapshot's trace from the bytes allocated at the start. The trace carries the sizes asked
for, while the allocator's ``max_memory_allocated`` counts whole blocks (rounded up to
512 bytes, and a cached block handed out unsplit when the rest would be too small to keep):
each size is rounded as the allocator rounds it, and the timeline's peak may still be
below the probe's by the unsplit blocks' slack. The operator of a CUDA point is the
innermost Python frame of the allocation (the memory history records frames, not operators).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tuner.core.phases import PEAK_PHASES
from tuner.core.timeline import (
    MAX_TIMELINE_POINTS,
    START_LABEL,
    MemoryTimeline,
    build_timeline,
    compact,
    spans_from_marks,
)

# Samples held before folding them (a step of millions of operators stays small).
_FOLD_AT = 64 * MAX_TIMELINE_POINTS
# The CUDA caching allocator's smallest block and rounding (c10 kMinBlockSize).
CUDA_BLOCK_BYTES = 512
# Allocator events torch's memory history keeps (a ring buffer): bounded host memory; a step
# with more allocations and frees records no timeline rather than a wrong one.
CUDA_HISTORY_EVENTS = 200_000


class TimelineRecorder:
    """Live bytes after each operator of a tracked block, kept where they changed.

    ``after`` is on the hot path of every operator: it counts, compares and, on a change,
    appends one tuple (the operator's name is formatted only for the points that are kept).
    """

    def __init__(self, start_bytes: int) -> None:
        self.length = 0
        self.sampled = 1
        self._last = start_bytes
        self._samples: list[tuple[int, int, Any]] = [(0, start_bytes, START_LABEL)]
        self._marks: list[tuple[str, int]] = []

    def after(self, live_bytes: int, operator: object) -> None:
        self.length += 1
        if live_bytes != self._last:
            self._last = live_bytes
            self._samples.append((self.length, live_bytes, operator))
            self.sampled += 1
            if len(self._samples) > _FOLD_AT:
                self._samples = compact(self._samples, MAX_TIMELINE_POINTS)

    def mark(self, phase: str) -> None:
        """A phase of the step ended here (the phases :data:`PEAK_PHASES` name; others,
        such as the accumulation's whole, are not marked)."""
        if phase in PEAK_PHASES:
            self._marks.append((phase, self.length))

    def timeline(self) -> MemoryTimeline:
        return build_timeline(
            source="cpu-tracker",
            length=self.length,
            samples=[(p, b, _operator_label(op)) for p, b, op in self._samples],
            phases=spans_from_marks(self._marks),
            sampled=self.sampled,
        )


def _operator_label(operator: object) -> str:
    """``aten.mm`` for the operator ``aten.mm.default``; labels that are text stay."""
    if isinstance(operator, str):
        return operator
    return str(operator).removesuffix(".default")


def cuda_block_size(size: int) -> int:
    """The bytes the CUDA caching allocator takes for a request of ``size``:
    ``max(512, 512·⌈size / 512⌉)``."""
    return max(CUDA_BLOCK_BYTES, -(-size // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES)


def timeline_from_trace(
    trace: Sequence[dict[str, Any]],
    *,
    start_bytes: int,
    expected_events: int,
    marks: Sequence[tuple[str, int]],
) -> MemoryTimeline | None:
    """The timeline of one device's trace (``snapshot["device_traces"][i]``, recorded from
    the start of the step): live bytes start at ``start_bytes``, each ``alloc`` adds its
    block size and each ``free_requested`` takes it away (the allocator's statistics
    change then, not when the free completes). ``marks`` end the phases at event counts;
    ``expected_events`` is how many allocations and frees the allocator counted meanwhile:
    fewer in the trace means its ring buffer dropped the oldest, and the timeline would be
    wrong, so there is none."""
    changes = [e for e in trace if e.get("action") in ("alloc", "free_requested")]
    if len(changes) < expected_events:
        return None
    live = start_bytes
    samples: list[tuple[int, int, str]] = [(0, start_bytes, START_LABEL)]
    for position, event in enumerate(changes, start=1):
        size = cuda_block_size(int(event["size"]))
        live += size if event["action"] == "alloc" else -size
        samples.append((position, max(0, live), _frame_label(event.get("frames") or [])))
    return build_timeline(
        source="cuda-memory-history",
        length=len(changes),
        samples=samples,
        phases=spans_from_marks([(p, min(at, len(changes))) for p, at in marks]),
    )


def _frame_label(frames: Sequence[dict[str, Any]]) -> str:
    """The innermost frame as ``name (file:line)``; torch lists frames innermost first."""
    for frame in frames:
        filename = str(frame.get("filename", ""))
        if filename and not filename.startswith("??"):
            return (
                f"{frame.get('name', '?')} ({filename.rsplit('/', 1)[-1]}:{frame.get('line', 0)})"
            )
    return "(no frame recorded)"
