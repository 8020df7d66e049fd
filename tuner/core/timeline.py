"""Memory over time in one measured step: live bytes after each operator that changed them,
the phases of the step (forward and backward of each micro batch, the optimizer step) and
the peak. Torch-free: the engine builds it, the wire bounds it, the service stores and
draws it.

Compact by construction. A step runs thousands to millions of operators; the timeline keeps
only the samples where live bytes changed, then folds them into at most
:data:`MAX_TIMELINE_POINTS` points by keeping each stretch's envelope (:func:`compact`): the
lowest and the highest sample of each of ``MAX_TIMELINE_POINTS // 2 - 1`` equal stretches,
and the first and last sample. The highest sample of all is the highest of its stretch, so
the peak survives every fold, to the byte. As JSON a timeline is at most
:data:`MAX_TIMELINE_JSON_BYTES`.

The horizontal axis is a position in the step: the operator's number on the CPU (every
operator the step dispatched, counted from 1), the allocator event's number on CUDA (each
allocation and free of torch's memory history, counted from 1). Position 0 is the start.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tuner.core.phases import PeakPhase

# Bounds that keep a timeline small on the wire and in the database (one JSON column).
MAX_TIMELINE_POINTS = 1024
MAX_TIMELINE_OPERATORS = 256
MAX_OPERATOR_NAME = 64
MAX_TIMELINE_PHASES = 256
# Worst case, every number at its widest (positions up to 2^31, bytes up to 2^63):
# 1024 × (10 + 19 + 3 digits and 3 commas) + 256 × (64 + 3) + 256 phase spans × ~90
# + keys ≈ 82 KB; measured JSON of a real 1024-point timeline is a quarter of that.
MAX_TIMELINE_JSON_BYTES = 96 * 1024

TimelineSource = Literal["cpu-tracker", "cuda-memory-history"]
# What a position counts, by source: the axis label.
POSITION_UNITS: dict[str, str] = {
    "cpu-tracker": "operator",
    "cuda-memory-history": "allocator event",
}
START_LABEL = "(start of the step)"
OTHER_OPERATORS = "(other operators)"

T = TypeVar("T")


class PhaseSpan(BaseModel):
    """One phase of the step, from position ``start`` (excluded: what was live there is
    what the phase began with) to ``end`` (included)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    phase: PeakPhase
    micro_batch: int | None = Field(
        default=None, ge=0, description="which micro batch of the step; none for the optimizer"
    )
    start: int = Field(ge=0)
    end: int = Field(ge=0)

    @property
    def label(self) -> str:
        if self.micro_batch is None:
            return self.phase
        return f"{self.phase} {self.micro_batch + 1}"


class MemoryTimeline(BaseModel):
    """Live bytes over one measured step. Point ``i`` is ``(position[i], live_bytes[i])``,
    reached by the operator ``operators[operator[i]]``; ``peak_bytes`` is the highest."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: TimelineSource
    length: int = Field(ge=0, description="positions in the step (operators or events)")
    samples: int = Field(ge=0, description="samples where live bytes changed, before folding")
    position: list[int] = Field(max_length=MAX_TIMELINE_POINTS)
    live_bytes: list[int] = Field(max_length=MAX_TIMELINE_POINTS)
    operator: list[int] = Field(max_length=MAX_TIMELINE_POINTS)
    operators: list[str] = Field(max_length=MAX_TIMELINE_OPERATORS)
    phases: list[PhaseSpan] = Field(default_factory=list, max_length=MAX_TIMELINE_PHASES)
    peak_bytes: int = Field(ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> MemoryTimeline:
        problem = self._problem()
        if problem is not None:
            raise ValueError(f"timeline: {problem}")
        return self

    def _problem(self) -> str | None:
        points = len(self.position)
        if not points or len(self.live_bytes) != points or len(self.operator) != points:
            return "position, live_bytes and operator must be equally long and not empty"
        if any(b < a for a, b in zip(self.position, self.position[1:], strict=False)):
            return "positions must not decrease"
        if self.position[0] < 0 or self.position[-1] > self.length:
            return f"positions must lie in [0, length {self.length}]"
        if min(self.live_bytes) < 0:
            return "live bytes must not be negative"
        if any(not 0 <= o < len(self.operators) for o in self.operator):
            return "each operator index must name one of operators"
        if any(len(name) > MAX_OPERATOR_NAME for name in self.operators):
            return f"operator names must be at most {MAX_OPERATOR_NAME} characters"
        if self.peak_bytes != max(self.live_bytes):
            return (
                f"peak_bytes {self.peak_bytes} is not the highest point {max(self.live_bytes)}: "
                "send peak_bytes as max(live_bytes)"
            )
        last = 0
        for span in self.phases:
            if span.start < last or span.end < span.start or span.end > self.length:
                return "phases must follow one another within the step"
            last = span.end
        return None

    @property
    def unit(self) -> str:
        return POSITION_UNITS[self.source]

    @property
    def peak_point(self) -> int:
        """The index of the first point at the peak."""
        return self.live_bytes.index(self.peak_bytes)

    @property
    def peak_position(self) -> int:
        return self.position[self.peak_point]

    @property
    def peak_operator(self) -> str:
        return self.operators[self.operator[self.peak_point]]

    def phase_at(self, position: int) -> PhaseSpan | None:
        """The phase that position belongs to (a phase owns its end, not its start)."""
        for span in self.phases:
            if span.start < position <= span.end:
                return span
        return None

    def points(self) -> list[tuple[int, int, str]]:
        """``(position, live bytes, operator)`` of every point."""
        return [
            (p, b, self.operators[o])
            for p, b, o in zip(self.position, self.live_bytes, self.operator, strict=True)
        ]


def compact(samples: Sequence[tuple[int, int, T]], max_points: int) -> list[tuple[int, int, T]]:
    """At most ``max_points`` of ``samples`` (``(position, bytes, label)``, in order): all
    of them when few enough, else the first, the last and, of each of ``max_points // 2 − 1``
    equal stretches, its lowest and highest sample (the first of equals), in order. The
    highest sample of all is kept: it is the highest of its stretch."""
    if max_points < 4:
        raise ValueError("a timeline keeps at least 4 points")
    if len(samples) <= max_points:
        return list(samples)
    inner = samples[1:-1]
    stretches = max_points // 2 - 1
    kept: list[tuple[int, int, T]] = [samples[0]]
    for index in range(stretches):
        chunk = inner[len(inner) * index // stretches : len(inner) * (index + 1) // stretches]
        if not chunk:
            continue
        low = min(range(len(chunk)), key=lambda i: (chunk[i][1], i))
        high = max(range(len(chunk)), key=lambda i: (chunk[i][1], -i))
        kept.extend(chunk[i] for i in sorted({low, high}))
    kept.append(samples[-1])
    return kept


def operator_name(name: str) -> str:
    """A name as a timeline keeps it: at most :data:`MAX_OPERATOR_NAME` characters."""
    return name if len(name) <= MAX_OPERATOR_NAME else name[: MAX_OPERATOR_NAME - 1] + "…"


def build_timeline(
    *,
    source: TimelineSource,
    length: int,
    samples: Sequence[tuple[int, int, str]],
    phases: Sequence[PhaseSpan],
    sampled: int | None = None,
) -> MemoryTimeline:
    """The timeline of ``samples`` (``(position, live bytes, operator)``, the first at the
    start), folded to :data:`MAX_TIMELINE_POINTS`. Operators beyond the
    :data:`MAX_TIMELINE_OPERATORS` most frequent are named :data:`OTHER_OPERATORS`.
    ``sampled``: how many samples there were before an earlier fold (default: these)."""
    kept = compact(samples, MAX_TIMELINE_POINTS)
    counts = Counter(operator_name(label) for _, _, label in kept)
    names = [name for name, _ in counts.most_common(MAX_TIMELINE_OPERATORS - 1)]
    if len(counts) > len(names):
        names.append(OTHER_OPERATORS)
    index = {name: i for i, name in enumerate(names)}
    other = index.get(OTHER_OPERATORS, 0)
    return MemoryTimeline(
        source=source,
        length=length,
        samples=len(samples) if sampled is None else sampled,
        position=[p for p, _, _ in kept],
        live_bytes=[b for _, b, _ in kept],
        operator=[index.get(operator_name(label), other) for _, _, label in kept],
        operators=names,
        phases=list(phases[:MAX_TIMELINE_PHASES]),
        peak_bytes=max(b for _, b, _ in kept),
    )


def spans_from_marks(marks: Sequence[tuple[str, int]]) -> list[PhaseSpan]:
    """Phase spans from the ends of phases in order (``(phase, position)``): each starts
    where the one before ended. Forward and backward are numbered by micro batch, counted
    afresh after each optimizer step."""
    spans: list[PhaseSpan] = []
    start, forwards = 0, 0
    for phase, end in marks:
        if phase == "optimizer":
            spans.append(PhaseSpan(phase="optimizer", start=start, end=end))
            forwards = 0
        elif phase == "forward":
            spans.append(PhaseSpan(phase="forward", micro_batch=forwards, start=start, end=end))
            forwards += 1
        elif phase == "backward":
            spans.append(
                PhaseSpan(phase="backward", micro_batch=max(0, forwards - 1), start=start, end=end)
            )
        else:
            continue
        start = end
    return spans
