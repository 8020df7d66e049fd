"""A workload on every known device: measured, estimated, or neither, by the rule a
one-process answer follows.

A device with a profile of the workload is measured by its current profile at the
smallest mesh shape measured there (one process, for a one-process workload), capped by
the OOM reports made since; a device without one is estimated from the workload's newest
fit on another device (the one-process answer's own estimate), capped by every OOM report
ever made there. The dashboard's workload page hands the rows over and shows the result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal

from tuner.answer import current
from tuner.answer.evidence import DeviceRow, OomRow, ProfileRow
from tuner.core import plan
from tuner.core.errors import BadInputError
from tuner.core.results import ProbeResult


@dataclass(frozen=True)
class DeviceResult:
    """The workload on one device: measured by its newest profile there, or estimated from
    another device's fit (the same estimate the recommendation endpoint gives)."""

    device_id: int
    device_key: str
    device_name: str
    device_kind: str
    capacity_bytes: int
    basis: Literal["measured", "estimated", "none"]
    max_micro_batch_size: int | None
    samples_per_second: float | None = None
    best_samples_per_second: float | None = None
    best_micro_batch_size: int | None = None
    footprint_bytes: int | None = None
    profile_id: int | None = None
    profile_created_at: datetime | None = None
    profiles: int = 0
    oom_limit: int | None = None
    source_device_name: str | None = None
    note: str = ""

    @property
    def limited_max(self) -> int | None:
        """M* as recommendations use it: below the smallest OOM reported since."""
        if self.max_micro_batch_size is None:
            return None
        return plan.below_oom(self.max_micro_batch_size, self.oom_limit)


_ORDER = {"measured": 0, "estimated": 1, "none": 2}


def on_every_device(
    devices: Sequence[DeviceRow],
    profiles: Sequence[ProfileRow],
    probes: Mapping[int, Sequence[ProbeResult]],
    reports: Sequence[OomRow],
) -> list[DeviceResult]:
    """One result a device, measured first, then estimated, then neither (by name within
    each), from one workload's ``profiles`` (with ``probes`` of at least the current ones)
    and OOM ``reports``."""
    fitted = current.newest(p for p in profiles if p.fit is not None and p.fit.bytes_per_sample > 0)
    names = {device.id: device.name for device in devices}
    results: list[DeviceResult] = []
    for device in devices:
        shapes = current.current_per_shape(
            profiles, profiles[0].workload_id if profiles else 0, device.id
        )
        if shapes:
            row = shapes[0]
            count = sum(1 for p in profiles if p.device_id == device.id)
            oom = current.profile_cap(row, reports)
            timed = current.timed(row, probes.get(row.id, ()))
            results.append(_measured(device, row, timed, count, oom))
        else:
            limit = current.oom_cap(
                reports, fitted.workload_id if fitted else 0, device.id, since=None
            )
            source = names.get(fitted.device_id) if fitted is not None else None
            results.append(_estimated(device, fitted, source, limit))
    results.sort(key=lambda r: (_ORDER[r.basis], r.device_name))
    return results


def _base(device: DeviceRow, oom: int | None) -> DeviceResult:
    return DeviceResult(
        device_id=device.id,
        device_key=device.key,
        device_name=device.name,
        device_kind=device.kind,
        capacity_bytes=device.capacity_bytes,
        basis="none",
        max_micro_batch_size=None,
        oom_limit=oom,
    )


def _measured(
    device: DeviceRow,
    row: ProfileRow,
    probes: Sequence[ProbeResult],
    count: int,
    oom: int | None,
) -> DeviceResult:
    fitting = [p for p in probes if p.fits]
    probe = current.probe_at(fitting, row.max_micro_batch_size)
    timed = [p for p in fitting if p.samples_per_second is not None]
    best = max(timed, key=lambda p: p.samples_per_second or 0.0, default=None)
    return replace(
        _base(device, oom),
        basis="measured",
        max_micro_batch_size=row.max_micro_batch_size,
        samples_per_second=probe.samples_per_second if probe is not None else None,
        best_samples_per_second=best.samples_per_second if best is not None else None,
        best_micro_batch_size=best.micro_batch_size if best is not None else None,
        footprint_bytes=current.footprint(probe),
        profile_id=row.id,
        profile_created_at=row.created_at,
        profiles=count,
    )


def _estimated(
    device: DeviceRow, source: ProfileRow | None, source_device: str | None, oom: int | None
) -> DeviceResult:
    if source is None or source.fit is None:
        return replace(
            _base(device, oom), note="no profile here, and no fit elsewhere to estimate from"
        )
    base = replace(
        _base(device, oom),
        basis="estimated",
        profile_id=source.id,
        profile_created_at=source.created_at,
    )
    try:
        found = plan.estimate_max_micro_batch(
            source.fit, device.capacity_bytes, source.headroom, size_cap=source.size_cap
        )
    except BadInputError as exc:
        return replace(base, basis="none", note=exc.message)
    return replace(
        base,
        max_micro_batch_size=found,
        footprint_bytes=round(source.fit.predict(found)) if found > 0 else None,
        source_device_name=source_device,
    )
