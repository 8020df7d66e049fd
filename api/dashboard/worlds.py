"""The workload page's M* against world size, per device, parallel mode and mesh.

A workload's one-process, DDP and FSDP variants are separate workloads (the mode is part of
the key) sharing a name and a model; the page gathers them. A mesh's tensor-parallel degree
(tp) is a shape, like the world size: runs at (dp, tp) = (4, 1) and (2, 2) share a workload
and both have 4 ranks, so each (mode, tp) is a series of its own. For each device and
series: the measured points (the newest profile at each world size and that tp), the
estimate line where two or more shapes of the mode were measured
(``tuner.core.worlds.estimate_world_size`` over every shape measured, the fit the
recommendation endpoint answers unmeasured shapes with; world sizes it refuses, where it
would extrapolate, are left undrawn), and each measured profile's per-rank breakdown at its
M*.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from api import models
from api.store.profiles import to_result
from tuner.core.errors import BadInputError
from tuner.core.results import MemoryBreakdown, Profile
from tuner.core.shape import MeshShape
from tuner.core.worlds import WorldEstimate, fit_world_sizes
from tuner.core.worlds import estimate_world_size as at_world_size

# The line runs to twice the largest world size measured, and at least this far.
SMALLEST_RANGE = 8
# Each series of a chart (a mode at a tp) by its place: a colour, a marker shape for its
# measured points and a dash for its estimate line, so that no two series are told apart
# by colour alone (estimate_chart.js reads the names; no two of the colours are green).
STYLES = (
    ("--chart-allocated", "circle", (6, 4)),
    ("--chart-oom", "square", (2, 3)),
    ("--chart-reserved", "triangle", (10, 3, 2, 3)),
    ("--chart-footprint", "diamond", (1, 3)),
    ("--chart-speed", "cross", (12, 4)),
)
# The marker in words and in the legend's text (the legend's swatch is a colour).
SHAPE_SIGNS = {"circle": "●", "square": "■", "triangle": "▲", "diamond": "◆", "cross": "✚"}


@dataclass(frozen=True)
class RankParts:
    """One rank's peak and where it went, at the profile's M*."""

    rank: int
    peak_bytes: int | None
    breakdown: MemoryBreakdown | None


@dataclass(frozen=True)
class WorldPoint:
    world_size: int
    max_micro_batch_size: int
    profile_id: int
    ranks: list[RankParts]
    simulated: bool = False  # a fake world's profile (one process stood for rank 0)


def drawn_sizes(measured: Iterable[int], end: int, tp: int = 1) -> list[int]:
    """The world sizes a chart draws up to ``end``: the powers of two and the sizes
    measured, those of them that are multiples of ``tp`` (a mesh is dp × tp ranks). Only
    these are estimated, so a page costs a fit per drawn size, not one per rank up to the
    end (a 512-rank profile drew 1,024 of them)."""
    sizes = {1 << k for k in range(end.bit_length()) if 1 << k <= end}
    return sorted(w for w in sizes | set(measured) if w % tp == 0 and w <= end)


@dataclass(frozen=True)
class ModeSeries:
    """One parallel mode at one tp on one device: measured points and, from two shapes
    on, the estimate at each drawn world size (:func:`drawn_sizes`) that the fit answers
    without extrapolating."""

    mode: str
    points: list[WorldPoint]
    estimate: dict[int, int] = field(default_factory=dict)
    expected_error: float | None = None
    note: str = ""
    tp: int = 1

    @property
    def key(self) -> str:
        """``fsdp``, or ``fsdp-tp2`` for a mesh (series keys, as before meshes at tp 1)."""
        return self.mode if self.tp == 1 else f"{self.mode}-tp{self.tp}"

    @property
    def label(self) -> str:
        """``one process``, ``ddp``, or ``fsdp × tp 2`` for a mesh."""
        if self.mode == "none":
            return "one process"
        return self.mode if self.tp == 1 else f"{self.mode} × tp {self.tp}"


@dataclass(frozen=True)
class DeviceWorlds:
    device_id: int
    device_name: str
    series: list[ModeSeries]

    @property
    def range_end(self) -> int:
        largest = max(p.world_size for s in self.series for p in s.points)
        return max(SMALLEST_RANGE, 2 * largest)

    @property
    def xs(self) -> list[int]:
        """The world sizes drawn: powers of two up to range_end and the sizes measured."""
        return drawn_sizes({p.world_size for s in self.series for p in s.points}, self.range_end)

    @property
    def compact(self) -> bool:
        """One point and no line: said in a line of text, not drawn as a chart."""
        return sum(len(s.points) + len(s.estimate) for s in self.series) <= 1

    def styles(self) -> list[dict[str, Any]]:
        """Each series' colour, marker shape, its sign and estimate dash, by place."""
        return [
            {"colour": c, "shape": shape, "sign": SHAPE_SIGNS[shape], "dash": list(dash)}
            for c, shape, dash in (STYLES[i % len(STYLES)] for i in range(len(self.series)))
        ]

    def rows(self) -> list[dict[str, Any]]:
        """The chart's values as a table's rows, one per world size drawn with any value:
        ``{"world_size": 4, "values": [(measured, estimated), ...]}`` per series."""
        found = []
        for w in self.xs:
            values = [
                (
                    next((p.max_micro_batch_size for p in s.points if p.world_size == w), None),
                    s.estimate.get(w),
                )
                for s in self.series
            ]
            if any(v is not None for pair in values for v in pair):
                found.append({"world_size": w, "values": values})
        return found

    def chart(self) -> dict[str, Any]:
        """What the chart draws: the drawn world sizes up to range_end, and per mode and
        tp a measured series (gaps where nothing was measured) and an estimate series
        (gaps where the fit is not asked or refuses), each with its style."""
        xs = self.xs
        series: list[dict[str, Any]] = []
        for mode, style in zip(self.series, self.styles(), strict=True):
            drawn = {"mode": mode.mode, "tp": mode.tp, **style}
            measured = {p.world_size: p.max_micro_batch_size for p in mode.points}
            series.append(
                {
                    "key": f"{mode.key}-measured",
                    "label": f"{style['sign']} {mode.label} measured",
                    "values": [measured.get(w) for w in xs],
                    **drawn,
                }
            )
            if mode.estimate:
                series.append(
                    {
                        "key": f"{mode.key}-estimated",
                        "label": f"{style['sign']} {mode.label} estimated",
                        "values": [mode.estimate.get(w) for w in xs],
                        **drawn,
                    }
                )
        return {"xs": xs, "series": series}


def world_sizes(session: Session, workload: models.Workload) -> list[DeviceWorlds]:
    """Every device the workload's variants were profiled on, when any variant ran on
    several ranks or under DDP or FSDP; empty for a workload only ever run in one process."""
    family = select(models.Workload.id).where(
        models.Workload.project_id == workload.project_id,
        models.Workload.name == workload.name,
        models.Workload.parameter_count == workload.parameter_count,
        models.Workload.precision == workload.precision,
        models.Workload.optimizer == workload.optimizer,
        models.Workload.activation_checkpointing == workload.activation_checkpointing,
    )
    rows = session.scalars(
        select(models.Profile)
        .where(models.Profile.workload_id.in_(family))
        .order_by(models.Profile.received_at.desc(), models.Profile.id.desc())
    ).all()
    if all(row.parallel_mode == "none" and row.world_size == 1 for row in rows):
        return []
    # Newest first, so the first profile seen at a (device, mode, tp, world size) stays.
    newest: dict[tuple[int, str], dict[int, dict[int, models.Profile]]] = {}
    names: dict[int, str] = {}
    for row in rows:
        names[row.device_id] = row.device.name
        by_tp = newest.setdefault((row.device_id, row.parallel_mode), {})
        by_tp.setdefault(row.tp or 1, {}).setdefault(row.world_size, row)
    result = []
    for device_id in sorted(names, key=lambda d: (names[d], d)):
        series = [
            one
            for (device, mode), by_tp in sorted(newest.items(), key=lambda kv: kv[0][1])
            if device == device_id
            for one in _mode_series(mode, by_tp)
        ]
        result.append(DeviceWorlds(device_id, names[device_id], series))
    return result


def _mode_series(mode: str, by_tp: dict[int, dict[int, models.Profile]]) -> list[ModeSeries]:
    """A series per tp of one mode on one device; each estimated from every shape the mode
    measured there (the newest profile at each), as the recommendation endpoint fits them."""
    shapes = [by_tp[tp][w] for tp in sorted(by_tp) for w in sorted(by_tp[tp])]
    profiles: list[Profile] = [to_result(row) for row in shapes] if len(shapes) >= 2 else []
    end = max(SMALLEST_RANGE, 2 * max(row.world_size for row in shapes))
    return [_series(mode, tp, by_tp[tp], profiles, end) for tp in sorted(by_tp)]


def _series(
    mode: str, tp: int, by_world: dict[int, models.Profile], profiles: list[Profile], end: int
) -> ModeSeries:
    points = [_point(by_world[w]) for w in sorted(by_world)]
    if not profiles:
        return _one_shape(mode, tp, points, end)
    # One fit for every size drawn: each refits its probes left out one at a time.
    try:
        fit = fit_world_sizes(profiles)
    except BadInputError as exc:
        return ModeSeries(mode, points, note=f"no estimate: {exc.message}", tp=tp)
    estimate: dict[int, WorldEstimate] = {}
    refused: dict[int, str] = {}
    for w in drawn_sizes(by_world, end, tp):
        try:
            estimate[w] = at_world_size(profiles, MeshShape(w, tp), fit)
        except BadInputError as exc:
            refused[w] = exc.message
    if not estimate:
        return ModeSeries(mode, points, note=f"no estimate: {next(iter(refused.values()))}", tp=tp)
    note = ""
    if refused:
        sizes = _runs(list(refused), tp)
        note = f"not estimated at W = {sizes}: outside the shapes measured, it would extrapolate"
    return ModeSeries(
        mode,
        points,
        estimate={w: found.max_micro_batch_size for w, found in estimate.items()},
        expected_error=next(iter(estimate.values())).fit.max_relative_error,
        note=note,
        tp=tp,
    )


def _one_shape(mode: str, tp: int, points: list[WorldPoint], end: int) -> ModeSeries:
    """A mode measured at one shape on the device: nothing to fit, and the recommendation
    answers every larger world size at this tp with the M* measured, estimated (a rank
    holds no more as the world grows: ``MeshShape.bounds``, as ``tuner.answer.decide``
    reads it) and refuses smaller ones. One process is W = 1 only."""
    [point] = points
    if mode == "none":
        return ModeSeries(mode, points, note="one process: W = 1 only", tp=tp)
    measured = MeshShape(point.world_size, tp)
    larger = [
        w
        for w in drawn_sizes([point.world_size], end, tp)
        if w != point.world_size and measured.bounds(MeshShape(w, tp))
    ]
    if not larger:
        return ModeSeries(mode, points, note="one world size measured: nothing to estimate", tp=tp)
    note = (
        "one world size measured: larger ones are estimated at its M* (a rank holds no "
        "more as the world grows), smaller ones are not answered"
    )
    estimate = dict.fromkeys(larger, point.max_micro_batch_size)
    return ModeSeries(mode, points, estimate=estimate, note=note, tp=tp)


def _runs(sizes: list[int], step: int) -> str:
    """``9…16, 20`` for 9, 10, …, 16 and 20 at step 1: runs of three or more as ranges."""
    runs: list[list[int]] = []
    for size in sizes:
        if runs and size == runs[-1][-1] + step:
            runs[-1].append(size)
        else:
            runs.append([size])
    return ", ".join(
        f"{run[0]}…{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs
    )


def _point(row: models.Profile) -> WorldPoint:
    at_max = [p for p in row.probes if p.micro_batch_size == row.max_micro_batch_size and p.fits]
    ranks: list[RankParts] = []
    if at_max:
        probe = at_max[-1]
        peaks = list(probe.rank_peaks_bytes)
        breakdowns = [MemoryBreakdown.model_validate(b) for b in probe.rank_breakdowns]
        for rank in range(max(len(peaks), len(breakdowns))):
            ranks.append(
                RankParts(
                    rank,
                    peaks[rank] if rank < len(peaks) else None,
                    breakdowns[rank] if rank < len(breakdowns) else None,
                )
            )
    simulated = bool((row.settings or {}).get("simulated_ranks"))
    return WorldPoint(row.world_size, row.max_micro_batch_size, row.id, ranks, simulated)
