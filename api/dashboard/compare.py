"""Two profiles side by side: M*, the peak at M* and where it went, each with the
difference (B − A), and both profiles' peaks against micro batch size on one chart.

Every number is a stored measurement read as the profile page reads it
(:class:`api.dashboard.queries.ProfileDetail`); the page derives only the differences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from api import models
from api.dashboard import queries
from tuner.core.results import ProbeResult

Unit = Literal["count", "bytes", "rate"]
# Other profiles offered by a profile page's "compare with…": the newest of its workload or
# device, at most this many.
CANDIDATES_SHOWN = 50


def memory_parts(probe: ProbeResult | None) -> list[tuple[str, int, str]]:
    """Where a probe's peak went, as the profile page's bar shows it: (label, bytes, css
    class); the allocator's cache and memory outside torch only where there was some."""
    if probe is None or probe.breakdown is None:
        return []
    parts = probe.breakdown
    found = [
        ("Parameters", parts.parameters_bytes, "part-params"),
        ("Gradients", parts.gradients_bytes, "part-grads"),
        ("Optimizer state", parts.optimizer_state_bytes, "part-optim"),
        ("Activations and temporaries", parts.activations_bytes, "part-acts"),
    ]
    if parts.allocator_cache_bytes:
        found.append(("Allocator cache", parts.allocator_cache_bytes, "part-cache"))
    if probe.non_torch_bytes > 0:
        found.append(("Outside torch", probe.non_torch_bytes, "part-other"))
    return found


@dataclass(frozen=True)
class Line:
    """One measure of both profiles; ``None`` where a profile does not have it."""

    key: str
    label: str
    unit: Unit
    a: float | None
    b: float | None

    @property
    def difference(self) -> float | None:
        """B − A, where both are known."""
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def ratio(self) -> float | None:
        """(B − A) / A, where A is known and not zero."""
        difference = self.difference
        return None if difference is None or not self.a else difference / self.a


@dataclass(frozen=True)
class PeakPoint:
    micro_batch_size: int
    a: int | None
    b: int | None
    a_fits: bool | None
    b_fits: bool | None


@dataclass(frozen=True)
class Comparison:
    a: queries.ProfileDetail
    b: queries.ProfileDetail
    lines: list[Line]
    points: list[PeakPoint]

    def chart(self) -> dict[str, Any]:
        """The chart's data for estimate_chart.js: one series per profile, told apart by
        line (solid, dashed) and marker (circle, square) as well as colour."""
        xs = [point.micro_batch_size for point in self.points]
        return {
            "xs": xs,
            "series": [
                {
                    "key": "a",
                    "label": f"A: #{self.a.profile.id}",
                    "values": [point.a for point in self.points],
                    "colour": "--chart-reserved",
                    "line": "solid",
                    "marker": "circle",
                },
                {
                    "key": "b",
                    "label": f"B: #{self.b.profile.id}",
                    "values": [point.b for point in self.points],
                    "colour": "--chart-allocated",
                    "line": "dashed",
                    "marker": "square",
                },
            ],
        }


def _peaks(detail: queries.ProfileDetail) -> dict[int, ProbeResult]:
    """The last probe at each size that recorded a peak (one that ran out of memory before
    its step finished has none)."""
    found: dict[int, ProbeResult] = {}
    for probe in detail.profile.probes:
        if probe.footprint_bytes is not None:
            found[probe.micro_batch_size] = probe
    return found


def compare(session: Session, a_id: int, b_id: int, *, project_id: int) -> Comparison:
    """Profiles ``a_id`` and ``b_id`` of the project, side by side (a profile of another
    project is not found, as everywhere)."""
    a = queries.profile_detail(session, a_id, project_id=project_id)
    b = queries.profile_detail(session, b_id, project_id=project_id)
    at_a, at_b = a.at_max, b.at_max
    lines = [
        Line(
            "mstar",
            "M* (largest micro batch that fits)",
            "count",
            a.profile.max_micro_batch_size,
            b.profile.max_micro_batch_size,
        ),
        Line(
            "peak",
            "Peak at M* (reserved + outside torch)",
            "bytes",
            at_a.footprint_bytes if at_a else None,
            at_b.footprint_bytes if at_b else None,
        ),
        Line(
            "allocated",
            "Peak allocated at M*",
            "bytes",
            at_a.peak_allocated_bytes if at_a else None,
            at_b.peak_allocated_bytes if at_b else None,
        ),
    ]
    parts_a = {label: value for label, value, _ in memory_parts(at_a)}
    parts_b = {label: value for label, value, _ in memory_parts(at_b)}
    for label in dict.fromkeys([*parts_a, *parts_b]):
        key = "part-" + label.split()[0].lower()
        lines.append(Line(key, label, "bytes", parts_a.get(label), parts_b.get(label)))
    lines += [
        Line(
            "speed",
            "Samples per second at M*",
            "rate",
            at_a.samples_per_second if at_a else None,
            at_b.samples_per_second if at_b else None,
        ),
        Line(
            "capacity",
            "Device memory",
            "bytes",
            a.profile.device.capacity_bytes,
            b.profile.device.capacity_bytes,
        ),
        Line("budget", "Budget", "bytes", a.profile.budget_bytes, b.profile.budget_bytes),
    ]
    peaks_a, peaks_b = _peaks(a), _peaks(b)
    points = [
        PeakPoint(
            size,
            peaks_a[size].footprint_bytes if size in peaks_a else None,
            peaks_b[size].footprint_bytes if size in peaks_b else None,
            peaks_a[size].fits if size in peaks_a else None,
            peaks_b[size].fits if size in peaks_b else None,
        )
        for size in sorted({*peaks_a, *peaks_b})
    ]
    return Comparison(a=a, b=b, lines=lines, points=points)


@dataclass(frozen=True)
class Candidate:
    id: int
    label: str


def candidates(
    session: Session, profile_id: int, workload_id: int, device_id: int, *, project_id: int
) -> list[Candidate]:
    """Other profiles of the same workload or the same device, newest first: what a profile
    page offers to compare with."""
    p, w, d = models.Profile, models.Workload, models.Device
    rows = session.execute(
        select(p.id, w.name, d.name, p.max_micro_batch_size, p.world_size, p.parallel_mode)
        .join(w, w.id == p.workload_id)
        .join(d, d.id == p.device_id)
        .where(
            w.project_id == project_id,
            p.id != profile_id,
            or_(p.workload_id == workload_id, p.device_id == device_id),
        )
        .order_by(p.received_at.desc(), p.id.desc())
        .limit(CANDIDATES_SHOWN)
    ).all()
    return [
        Candidate(
            row[0],
            f"#{row[0]} · "
            + queries.run_label(row[1], parallel_mode=row[5], world_size=row[4])
            + f" · {row[2]} · M* {row[3]}",
        )
        for row in rows
    ]
