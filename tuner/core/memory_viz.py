"""A timeline as a memory snapshot that PyTorch's memory viewer opens
(https://pytorch.org/memory_viz, ``torch/cuda/_memory_viz.py``): a pickled dict of plain
Python values, ``{"segments": [...], "device_traces": [[...]]}``, as
``torch.cuda.memory._snapshot()`` returns. Torch-free: the service builds it without torch.

The timeline keeps live bytes, not each tensor, so the snapshot stands each change for
allocations of its size: a rise is one ``alloc`` of the difference, a fall frees the newest
blocks first (a block larger than what is left to free is freed and its remainder allocated
again in its place). Blocks therefore sit on a stack in one segment, so the live bytes the
viewer adds up equal the timeline's at every point, and its segment is exactly the peak.
What was live at the start (parameters, gradients, optimizer state, the batch) is one block
allocated before the trace. Each allocation's frames name the operator and the phase.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

from tuner.core.timeline import START_LABEL, MemoryTimeline

# Where the one segment starts: an address of the kind CUDA hands out (any value will do).
SEGMENT_ADDRESS = 0x7F00_0000_0000
MEDIA_TYPE = "application/octet-stream"


@dataclass
class _Block:
    address: int
    size: int
    frames: list[dict[str, Any]]


def snapshot(timeline: MemoryTimeline, *, device: int = 0) -> dict[str, Any]:
    """The timeline as ``torch.cuda.memory._snapshot()``'s dict for ``device``."""
    stack: list[_Block] = []
    events: list[dict[str, Any]] = []
    top = SEGMENT_ADDRESS

    def push(size: int, frames: list[dict[str, Any]], *, traced: bool = True) -> None:
        nonlocal top
        stack.append(_Block(top, size, frames))
        if traced:
            events.append(_event("alloc", stack[-1]))
        top += size

    def pop() -> _Block:
        nonlocal top
        block = stack.pop()
        events.append(_event("free_requested", block))
        events.append(_event("free_completed", block))
        top = block.address
        return block

    points = timeline.points()
    start_bytes = points[0][1]
    if start_bytes:
        push(start_bytes, [_frame(START_LABEL, 0, "resident")], traced=False)
    live = start_bytes
    for position, live_bytes, operator in points[1:]:
        frames = _frames(timeline, position, operator)
        if live_bytes > live:
            push(live_bytes - live, frames)
        to_free = live - live_bytes
        while to_free > 0:
            block = pop()
            if block.size > to_free:
                push(block.size - to_free, block.frames)
                to_free = 0
            else:
                to_free -= block.size
        live = live_bytes
    return {
        "segments": [_segment(stack, device, timeline.peak_bytes)],
        "device_traces": [[] for _ in range(device)] + [events],
    }


def snapshot_pickle(timeline: MemoryTimeline, *, device: int = 0) -> bytes:
    """:func:`snapshot`, pickled as ``torch.cuda.memory._dump_snapshot`` writes it."""
    return pickle.dumps(snapshot(timeline, device=device))


def _frame(filename: str, line: int, name: str) -> dict[str, Any]:
    return {"filename": filename, "line": line, "name": name}


def _frames(timeline: MemoryTimeline, position: int, operator: str) -> list[dict[str, Any]]:
    """Innermost first, as torch's frames are: the operator at its position, then the phase."""
    span = timeline.phase_at(position)
    phase = span.label if span is not None else "outside the phases"
    return [_frame(timeline.unit, position, operator), _frame("phase", 0, phase)]


def _event(action: str, block: _Block) -> dict[str, Any]:
    return {
        "action": action,
        "addr": block.address,
        "size": block.size,
        "stream": 0,
        "frames": block.frames,
    }


def _segment(stack: list[_Block], device: int, peak_bytes: int) -> dict[str, Any]:
    """The one segment at the end of the step: the blocks still live, then free space up
    to the peak (the most the stack ever held)."""
    blocks: list[dict[str, Any]] = [
        {
            "address": b.address,
            "size": b.size,
            "requested_size": b.size,
            "state": "active_allocated",
            "frames": b.frames,
        }
        for b in stack
    ]
    allocated = sum(b.size for b in stack)
    total = max(peak_bytes, allocated, 1)
    if total > allocated:
        blocks.append(
            {
                "address": SEGMENT_ADDRESS + allocated,
                "size": total - allocated,
                "requested_size": 0,
                "state": "inactive",
                "frames": [],
            }
        )
    return {
        "device": device,
        "address": SEGMENT_ADDRESS,
        "total_size": total,
        "allocated_size": allocated,
        "active_size": allocated,
        "requested_size": allocated,
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": blocks,
    }
