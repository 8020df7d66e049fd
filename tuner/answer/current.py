"""Which profile is current, what caps it, and how much memory it leaves: one definition
each, read by every answer and every page.

- **Current**: a workload's profile on a device is current at its mesh shape (world size
  and tp) until a newer one exists at that shape; "newer" is received later by the
  service (then stored later), never measured later, so a back-dated upload cannot
  replace what the service already had.
- **OOM cap**: training that ran out of memory caps the answers of the pair below
  ``min(settled + 1, failed)`` (the smallest over reports). A report caps a profile when
  it was made after the profile was received; a device with no profile of its own is
  capped by every report ever made there. A report that names the profile its plan came
  from caps that profile's workload only (the row it attaches to).
- **Footprint** at a size: the probe's reserved peak, plus memory outside torch (CUDA
  context, other processes), plus, on CPU ranks under gloo, the copies collectives make
  (which a GPU under NCCL does not hold): what the budget is compared with, so
  ``free = capacity − footprint``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from tuner.answer.evidence import OomRow, ProfileRow
from tuner.core.results import ProbeResult
from tuner.core.shape import MeshShape
from tuner.core.speeds import SpeedCurve


def newest(profiles: Iterable[ProfileRow]) -> ProfileRow | None:
    """The profile received last (then stored last)."""
    return max(profiles, key=lambda row: row.recency, default=None)


def of_pair(profiles: Iterable[ProfileRow], workload_id: int, device_id: int) -> list[ProfileRow]:
    return [p for p in profiles if p.workload_id == workload_id and p.device_id == device_id]


def current_at(
    profiles: Iterable[ProfileRow], workload_id: int, device_id: int, mesh: MeshShape
) -> ProfileRow | None:
    """The pair's current profile at ``mesh``, if any."""
    return newest(p for p in of_pair(profiles, workload_id, device_id) if p.mesh == mesh)


def current_per_shape(
    profiles: Iterable[ProfileRow], workload_id: int, device_id: int
) -> list[ProfileRow]:
    """The pair's current profile at each mesh shape, smallest shape first."""
    by_shape: dict[MeshShape, ProfileRow] = {}
    for row in of_pair(profiles, workload_id, device_id):
        held = by_shape.get(row.mesh)
        if held is None or row.recency > held.recency:
            by_shape[row.mesh] = row
    return [by_shape[shape] for shape in sorted(by_shape, key=lambda s: (s.world_size, s.tp))]


def superseded(profile: ProfileRow, profiles: Iterable[ProfileRow]) -> bool:
    """Whether a newer profile of the pair exists at the profile's mesh shape."""
    found = current_at(profiles, profile.workload_id, profile.device_id, profile.mesh)
    return found is not None and found.id != profile.id


def caps(report: OomRow, workload_id: int, device_id: int) -> bool:
    """Whether ``report`` is about this pair."""
    return report.workload_id == workload_id and report.device_id == device_id


def oom_cap(
    reports: Iterable[OomRow], workload_id: int, device_id: int, *, since: datetime | None
) -> int | None:
    """The smallest limit of the pair's reports made after ``since`` (every report when
    ``since`` is ``None``); ``None`` when none caps it."""
    limits = [
        r.limit
        for r in reports
        if caps(r, workload_id, device_id) and (since is None or r.created_at > since)
    ]
    return min(limits, default=None)


def profile_cap(profile: ProfileRow, reports: Iterable[OomRow]) -> int | None:
    """The cap on ``profile``: the pair's reports made since it was received."""
    return oom_cap(reports, profile.workload_id, profile.device_id, since=profile.received_at)


def capped_profile(report: OomRow, profiles: Iterable[ProfileRow]) -> ProfileRow | None:
    """The profile a report caps, to point a reader at: the one its plan came from when
    the reporter said, else the pair's newest received before the report (what answers
    were read from when training ran out of memory); ``None`` where the pair had none."""
    pair = of_pair(profiles, report.workload_id, report.device_id)
    if report.profile_id is not None:
        named = [p for p in pair if p.id == report.profile_id]
        if named:
            return named[0]
    return newest(p for p in pair if p.received_at < report.created_at)


def footprint(probe: ProbeResult | None) -> int | None:
    """Reserved peak + memory outside torch + CPU collective copies; ``None`` when the
    probe did not finish (or there is none)."""
    return probe.footprint_bytes if probe is not None else None


def probe_at(probes: Sequence[ProbeResult], micro_batch_size: int) -> ProbeResult | None:
    """The last probe that ran at this size."""
    found = [p for p in probes if p.micro_batch_size == micro_batch_size]
    return found[-1] if found else None


def timed(profile: ProfileRow, probes: Sequence[ProbeResult]) -> Sequence[ProbeResult]:
    """The probes as an answer may quote their speed: without one where one process stood
    for the ranks of a fake world, whose collectives moved no data (its steps are no
    measure of training's)."""
    if not profile.simulated_ranks:
        return probes
    return [p.model_copy(update={"samples_per_second": None, "step_time_s": None}) for p in probes]


def speed_curve(profile: ProfileRow, speeds: SpeedCurve | None) -> SpeedCurve | None:
    """The speed curve an answer may compare splits by: none where one process stood for
    the ranks of a fake world (as :func:`timed`)."""
    return None if profile.simulated_ranks else speeds


def speed_at_max(profile: ProfileRow, probes: Sequence[ProbeResult]) -> float:
    """The fastest fitting probe's samples per second at the profile's own M* (0 if none)."""
    speeds = [
        p.samples_per_second
        for p in probes
        if p.fits and p.micro_batch_size == profile.max_micro_batch_size and p.samples_per_second
    ]
    return max(speeds, default=0.0)
