"""The profile page's memory timeline: live bytes over the step at M*, its phases and peak,
as the chart draws them (``memory_timeline.js``) and the tables list them."""

from __future__ import annotations

import json
from dataclasses import dataclass

from tuner.core.results import ProbeResult
from tuner.core.timeline import MemoryTimeline, PhaseSpan


@dataclass(frozen=True)
class PhaseRow:
    """One phase of the step with the highest of its points kept (a fold keeps each
    stretch's extremes, and a stretch may straddle two phases: the step's peak is exact)."""

    label: str
    phase: str
    start: int
    end: int
    highest_bytes: int | None
    holds_peak: bool


@dataclass(frozen=True)
class PointRow:
    position: int
    live_bytes: int
    operator: str
    phase: str
    is_peak: bool


@dataclass(frozen=True)
class TimelineView:
    """What the page shows of a probe's timeline."""

    timeline: MemoryTimeline
    micro_batch_size: int
    measured_peak_bytes: int | None
    phases: list[PhaseRow]
    points: list[PointRow]
    chart_data: str

    @property
    def peak_phase(self) -> str:
        span = self.timeline.phase_at(self.timeline.peak_position)
        return span.label if span is not None else "the start of the step"

    @property
    def agrees(self) -> bool:
        """Whether the timeline's peak is the probe's allocated peak, to the byte."""
        return self.measured_peak_bytes == self.timeline.peak_bytes


def timeline_view(probe: ProbeResult | None) -> TimelineView | None:
    """The view of ``probe``'s timeline; ``None`` when it has none (stored before
    timelines were kept, measured on several ranks, or no size fits)."""
    if probe is None or probe.timeline is None:
        return None
    timeline = probe.timeline
    peak_point = timeline.peak_point
    points = [
        PointRow(
            position=position,
            live_bytes=live,
            operator=operator,
            phase=_label(timeline.phase_at(position)),
            is_peak=index == peak_point,
        )
        for index, (position, live, operator) in enumerate(timeline.points())
    ]
    peak_span = timeline.phase_at(timeline.peak_position)
    phases = [
        PhaseRow(
            label=span.label,
            phase=span.phase,
            start=span.start,
            end=span.end,
            highest_bytes=max(
                (p.live_bytes for p in points if span.start < p.position <= span.end),
                default=None,
            ),
            holds_peak=span == peak_span,
        )
        for span in timeline.phases
    ]
    chart = {
        "unit": timeline.unit,
        "x": timeline.position,
        "y": timeline.live_bytes,
        "operators": [timeline.operators[o] for o in timeline.operator],
        "phases": [
            {"label": s.label, "phase": s.phase, "start": s.start, "end": s.end}
            for s in timeline.phases
        ],
        "peak": {
            "x": timeline.peak_position,
            "y": timeline.peak_bytes,
            "operator": timeline.peak_operator,
        },
    }
    return TimelineView(
        timeline=timeline,
        micro_batch_size=probe.micro_batch_size,
        measured_peak_bytes=probe.peak_allocated_bytes,
        phases=phases,
        points=points,
        chart_data=json.dumps(chart, separators=(",", ":")),
    )


def _label(span: PhaseSpan | None) -> str:
    return span.label if span is not None else "start"
