"""A workload on every known device: measured, estimated, or neither, by the rule a
one-process recommendation follows.

A device with a profile of the workload is measured by its newest one, and the OOM
reports that cap it are those made since; a device without one is estimated from the
workload's newest fit on another device (:func:`api.answers.recommendation.on_device`,
the recommendation's own estimate), capped by every OOM report ever made there. The
dashboard's workload page reads the rows and asks this module; it decides nothing itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal

from api import models
from api.answers.recommendation import on_device
from api.store.profiles import fit_of
from tuner.core import plan
from tuner.core.errors import BadInputError
from tuner.core.results import AffineFit


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
    devices: Sequence[models.Device],
    *,
    newest: Mapping[int, models.Profile],
    counts: Mapping[int, int],
    limit_since_newest: Mapping[int, int | None],
    limit_ever: Mapping[int, int | None],
    source: models.Profile | None,
) -> list[DeviceResult]:
    """One result a device, measured first, then estimated, then neither (by name within
    each). ``newest``: the workload's newest profile on each device that has one;
    ``counts``: its profiles there; ``limit_since_newest`` / ``limit_ever``: the smallest
    OOM reported since that profile / ever, by device; ``source``: the newest profile with
    a fit, on any device."""
    fit = fit_of(source) if source is not None else None  # one fit for every device
    results: list[DeviceResult] = []
    for device in devices:
        row = newest.get(device.id)
        if row is not None:
            oom = limit_since_newest.get(device.id)
            results.append(_measured(device, row, counts.get(device.id, 0), oom))
        else:
            results.append(_estimated(device, source, fit, limit_ever.get(device.id)))
    results.sort(key=lambda r: (_ORDER[r.basis], r.device_name))
    return results


def _base(device: models.Device, oom: int | None) -> DeviceResult:
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
    device: models.Device, row: models.Profile, count: int, oom: int | None
) -> DeviceResult:
    fitting = [p for p in row.probes if p.fits]
    at_max = [p for p in fitting if p.micro_batch_size == row.max_micro_batch_size]
    probe = at_max[-1] if at_max else None
    timed = [p for p in fitting if p.samples_per_second is not None]
    best = max(timed, key=lambda p: p.samples_per_second or 0.0, default=None)
    footprint = None
    if probe is not None and probe.peak_reserved_bytes is not None:
        footprint = probe.peak_reserved_bytes + probe.non_torch_bytes
    return replace(
        _base(device, oom),
        basis="measured",
        max_micro_batch_size=row.max_micro_batch_size,
        samples_per_second=probe.samples_per_second if probe is not None else None,
        best_samples_per_second=best.samples_per_second if best is not None else None,
        best_micro_batch_size=best.micro_batch_size if best is not None else None,
        footprint_bytes=footprint,
        profile_id=row.id,
        profile_created_at=row.created_at,
        profiles=count,
    )


def _estimated(
    device: models.Device,
    source: models.Profile | None,
    fit: AffineFit | None,
    oom: int | None,
) -> DeviceResult:
    if source is None or fit is None:
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
        estimate = on_device(
            fit,
            capacity_bytes=device.capacity_bytes,
            headroom=source.headroom,
            size_cap=source.size_cap,
        )
    except BadInputError as exc:
        return replace(base, basis="none", note=exc.message)
    return replace(
        base,
        max_micro_batch_size=estimate.max_micro_batch_size,
        footprint_bytes=estimate.footprint_bytes,
        source_device_name=source.device.name,
    )
