"""The workload page's M* against world size, per device and parallel mode.

A workload's one-process, DDP and FSDP variants are separate workloads (the mode is part of
the key) sharing a name and a model; the page gathers them. For each device and mode:
the measured points (the newest profile at each world size), the estimate line where two
or more world sizes were measured (``api.answers.recommendation.at_world_size``, the fit
the recommendation endpoint answers unmeasured world sizes with), and each measured
profile's per-rank breakdown at its M*.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from api import models
from api.answers.recommendation import at_world_size
from api.store.profiles import to_result
from tuner.core.errors import BadInputError
from tuner.core.results import MemoryBreakdown, Profile

# The line runs to twice the largest world size measured, and at least this far.
SMALLEST_RANGE = 8


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


@dataclass(frozen=True)
class ModeSeries:
    """One parallel mode on one device: measured points and, from two world sizes on,
    the estimate at every world size up to ``range_end``."""

    mode: str
    points: list[WorldPoint]
    estimate: dict[int, int] = field(default_factory=dict)
    expected_error: float | None = None
    note: str = ""


@dataclass(frozen=True)
class DeviceWorlds:
    device_id: int
    device_name: str
    series: list[ModeSeries]

    @property
    def range_end(self) -> int:
        largest = max(p.world_size for s in self.series for p in s.points)
        return max(SMALLEST_RANGE, 2 * largest)

    def chart(self) -> dict[str, Any]:
        """What the chart draws: world sizes 1…range_end, and per mode a measured series
        (gaps where nothing was measured) and an estimate series."""
        xs = list(range(1, self.range_end + 1))
        series: list[dict[str, Any]] = []
        for mode in self.series:
            measured = {p.world_size: p.max_micro_batch_size for p in mode.points}
            series.append(
                {
                    "key": f"{mode.mode}-measured",
                    "mode": mode.mode,
                    "label": f"{mode.mode} measured",
                    "values": [measured.get(w) for w in xs],
                }
            )
            if mode.estimate:
                series.append(
                    {
                        "key": f"{mode.mode}-estimated",
                        "mode": mode.mode,
                        "label": f"{mode.mode} estimated",
                        "values": [mode.estimate.get(w) for w in xs],
                    }
                )
        return {"xs": xs, "series": series}


def world_sizes(session: Session, workload: models.Workload) -> list[DeviceWorlds]:
    """Every device the workload's variants were profiled on, when any variant ran on
    several ranks or under DDP or FSDP; empty for a workload only ever run in one process."""
    family = select(models.Workload.id).where(
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
    # Newest first, so the first profile seen at a (device, mode, world size) stays.
    newest: dict[tuple[int, str], dict[int, models.Profile]] = {}
    names: dict[int, str] = {}
    for row in rows:
        names[row.device_id] = row.device.name
        newest.setdefault((row.device_id, row.parallel_mode), {}).setdefault(row.world_size, row)
    result = []
    for device_id in sorted(names, key=lambda d: (names[d], d)):
        series = [
            _series(mode, by_world)
            for (device, mode), by_world in sorted(newest.items(), key=lambda kv: kv[0][1])
            if device == device_id
        ]
        result.append(DeviceWorlds(device_id, names[device_id], series))
    return result


def _series(mode: str, by_world: dict[int, models.Profile]) -> ModeSeries:
    points = [_point(by_world[w]) for w in sorted(by_world)]
    if len(by_world) < 2:
        return ModeSeries(mode, points, note="one world size measured: no estimate line")
    profiles: list[Profile] = [to_result(by_world[w]) for w in sorted(by_world)]
    end = max(SMALLEST_RANGE, 2 * max(by_world))
    try:
        estimate = {w: at_world_size(profiles, w) for w in range(1, end + 1)}
    except BadInputError as exc:
        return ModeSeries(mode, points, note=f"no estimate: {exc.message}")
    error = next(iter(estimate.values())).fit.max_relative_error
    return ModeSeries(
        mode,
        points,
        estimate={w: found.max_micro_batch_size for w, found in estimate.items()},
        expected_error=error,
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
    return WorldPoint(row.world_size, row.max_micro_batch_size, row.id, ranks)
