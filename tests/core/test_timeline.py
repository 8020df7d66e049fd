"""The timeline's schema and its fold (tuner.core.timeline), and its snapshot for PyTorch's
memory viewer (tuner.core.memory_viz) read back by torch's own ``torch.cuda._memory_viz``."""

from __future__ import annotations

import pickle
import random
from typing import Any

import pytest
from pydantic import ValidationError
from torch.cuda import _memory_viz

from tuner.core.memory_viz import snapshot, snapshot_pickle
from tuner.core.timeline import (
    MAX_TIMELINE_JSON_BYTES,
    MAX_TIMELINE_OPERATORS,
    MAX_TIMELINE_POINTS,
    OTHER_OPERATORS,
    MemoryTimeline,
    build_timeline,
    compact,
    spans_from_marks,
)

STEP = [("forward", 300), ("backward", 900), ("accumulate", 900), ("forward", 1200)]
STEP += [("backward", 1800), ("accumulate", 1800), ("optimizer", 2000)]


def walk(length: int, seed: int, *, start: int = 10_000) -> list[tuple[int, int, str]]:
    rng = random.Random(seed)
    samples, live = [(0, start, "(start of the step)")], start
    for position in range(1, length + 1):
        live = max(0, live + rng.randint(-900, 1000))
        samples.append((position, live, f"aten.op{position % 40}"))
    return samples


@pytest.mark.parametrize("seed", range(5))
def test_the_fold_keeps_the_bound_the_ends_and_the_peak(seed: int) -> None:
    samples = walk(20_000, seed)
    kept = compact(samples, MAX_TIMELINE_POINTS)
    assert len(kept) <= MAX_TIMELINE_POINTS
    assert kept[0] == samples[0]
    assert kept[-1] == samples[-1]
    assert max(b for _, b, _ in kept) == max(b for _, b, _ in samples)
    assert min(b for _, b, _ in kept) == min(b for _, b, _ in samples)
    assert [p for p, _, _ in kept] == sorted(p for p, _, _ in kept)
    assert set(kept) <= set(samples)  # points that happened, none made up


def test_few_samples_are_kept_as_they_are() -> None:
    samples = walk(100, 0)
    assert compact(samples, MAX_TIMELINE_POINTS) == samples


def test_a_timeline_names_its_phases_in_step_order() -> None:
    spans = spans_from_marks(STEP)
    assert [(s.label, s.start, s.end) for s in spans] == [
        ("forward 1", 0, 300),
        ("backward 1", 300, 900),
        ("forward 2", 900, 1200),
        ("backward 2", 1200, 1800),
        ("optimizer", 1800, 2000),
    ]


def timeline(length: int = 2000, seed: int = 1) -> MemoryTimeline:
    return build_timeline(
        source="cpu-tracker",
        length=length,
        samples=walk(length, seed),
        phases=spans_from_marks(STEP),
    )


def test_many_operators_are_bounded_and_the_rest_named_other() -> None:
    samples = [(i, 1000 + i, f"aten.op{i}") for i in range(3000)]
    built = build_timeline(source="cpu-tracker", length=3000, samples=samples, phases=[])
    assert len(built.operators) == MAX_TIMELINE_OPERATORS
    assert OTHER_OPERATORS in built.operators
    assert built.peak_bytes == 3999


def test_the_widest_timeline_stays_within_its_stated_size() -> None:
    widest = MemoryTimeline(
        source="cuda-memory-history",
        length=2**31 - 1,
        samples=2**31 - 1,
        position=[2**31 - 1024 + i for i in range(MAX_TIMELINE_POINTS)],
        live_bytes=[2**62 + i for i in range(MAX_TIMELINE_POINTS)],
        operator=[i % MAX_TIMELINE_OPERATORS for i in range(MAX_TIMELINE_POINTS)],
        operators=[f"{i:03d}".ljust(64, "x") for i in range(MAX_TIMELINE_OPERATORS)],
        phases=spans_from_marks([("forward", 2**31 - 1)] * 1),
        peak_bytes=2**62 + MAX_TIMELINE_POINTS - 1,
    )
    assert len(widest.model_dump_json()) <= MAX_TIMELINE_JSON_BYTES


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"peak_bytes": 1}, "is not the highest point"),
        ({"position": [0, 3, 5]}, "must be equally long"),
        ({"operator": [0, 99]}, "each operator index"),
        ({"position": [3, 2], "live_bytes": [1, 2], "operator": [0, 0]}, "must not decrease"),
        ({"length": 1}, "must lie in"),
    ],
)
def test_an_inconsistent_timeline_is_refused(change: dict[str, Any], message: str) -> None:
    good = {
        "source": "cpu-tracker",
        "length": 10,
        "samples": 2,
        "position": [0, 4],
        "live_bytes": [100, 300],
        "operator": [0, 1],
        "operators": ["(start of the step)", "aten.mm"],
        "peak_bytes": 300,
    }
    MemoryTimeline.model_validate(good)
    with pytest.raises(ValidationError, match=message):
        MemoryTimeline.model_validate({**good, **change})


def replay(data: dict[str, Any]) -> list[int]:
    """Live bytes after each change of the snapshot's trace, as a viewer adds them up: what
    was allocated before the trace (the segments' blocks at the end, less the trace's
    allocations, plus its frees) and then each alloc and free_requested."""
    events = data["device_traces"][0]
    at_end = sum(
        b["size"] for s in data["segments"] for b in s["blocks"] if b["state"] == "active_allocated"
    )
    allocated = sum(e["size"] for e in events if e["action"] == "alloc")
    freed = sum(e["size"] for e in events if e["action"] == "free_requested")
    live = at_end - allocated + freed
    lives = [live]
    for event in events:
        if event["action"] == "alloc":
            live += event["size"]
        elif event["action"] == "free_requested":
            live -= event["size"]
        else:
            continue
        lives.append(live)
    return lives


def test_the_snapshot_adds_up_to_the_timeline_at_every_point() -> None:
    built = timeline()
    data = snapshot(built)
    lives = replay(data)
    assert max(lives) == built.peak_bytes
    assert lives[0] == built.live_bytes[0]
    assert lives[-1] == built.live_bytes[-1]
    assert set(built.live_bytes) <= set(lives)  # every point is a state the viewer shows
    (segment,) = data["segments"]
    assert segment["total_size"] == built.peak_bytes  # the stack never held more


def test_torchs_memory_viz_reads_the_download() -> None:
    data = pickle.loads(snapshot_pickle(timeline()))
    # torch's own readers: the segment summary checks that every byte is accounted for,
    # the trace reads every entry, the plots embed the pickle.
    summary = _memory_viz.segsum(data)
    assert "segments: 1" in summary
    text = _memory_viz.trace(data)
    assert f"{len(data['device_traces'][0])} entries" in text
    assert "Active Memory Timeline" in _memory_viz.trace_plot(data)
    assert "Allocator State History" in _memory_viz.segment_plot(data)
    paired = _memory_viz.filter_alloc_free_pairs(pickle.loads(snapshot_pickle(timeline())))
    assert all(e["action"] != "free_completed" for e in paired["device_traces"][0])
    # Each rise is an allocation named by its operator and phase (innermost frame first).
    rise = next(e for e in data["device_traces"][0] if e["frames"][0]["filename"] == "operator")
    assert [f["filename"] for f in rise["frames"]] == ["operator", "phase"]
    assert _memory_viz._frames_fmt(rise["frames"])[1].startswith("phase:0:forward 1")
