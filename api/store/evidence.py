"""The evidence a question is answered from, read from the SQL store: plain reads only.

Each method is one indexed statement through the ORM session and returns the rows as
:mod:`tuner.answer.evidence` values; nothing here chooses among them (which row a name
means, which profile is current, what an OOM report caps: :mod:`tuner.answer`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy import BindParameter, bindparam, or_, select
from sqlalchemy.orm import Session

from api import models
from tuner.answer.evidence import DeviceRow, OomRow, ProfileRow, WorkloadRow
from tuner.core.parallel import Parallel
from tuner.core.results import AffineFit, MemoryBreakdown, ProbeResult
from tuner.core.speeds import SpeedCurve

_W, _D, _P, _Pr, _O = (
    models.Workload,
    models.Device,
    models.Profile,
    models.Probe,
    models.OomReport,
)
_WORKLOAD_COLUMNS = (
    _W.id,
    _W.key,
    _W.name,
    _W.target,
    _W.parallel_mode,
    _W.parameter_count,
    _W.precision,
    _W.optimizer,
    _W.activation_checkpointing,
    _W.seq_len,
    _W.length_family,
    _W.registered_by,
)
_DEVICE_COLUMNS = (_D.id, _D.key, _D.name, _D.capacity_bytes, _D.kind, _D.registered_by)
_PROFILE_COLUMNS = (
    _P.id,
    _P.workload_id,
    _P.device_id,
    _D.key,
    _P.received_at,
    _P.created_at,
    _P.max_micro_batch_size,
    _P.headroom,
    _P.size_cap,
    _P.world_size,
    _P.parallel,
    _P.budget_bytes,
    _P.strategy,
    _P.fit_fixed_bytes,
    _P.fit_bytes_per_sample,
    _P.fit_points,
    _P.variant_group,
    _P.variant_chosen,
    _P.settings["simulated_ranks"].as_boolean(),
)
_PROBE_COLUMNS = (
    _Pr.profile_id,
    _Pr.micro_batch_size,
    _Pr.fits,
    _Pr.peak_allocated_bytes,
    _Pr.peak_reserved_bytes,
    _Pr.non_torch_bytes,
    _Pr.phase_peaks_bytes,
    _Pr.breakdown,
    _Pr.samples_per_second,
)


def workload_row(row: Any) -> WorkloadRow:
    return WorkloadRow(*row)


def device_row(row: Any) -> DeviceRow:
    return DeviceRow(*row)


def profile_row(row: Any) -> ProfileRow:
    """A profile's columns (as ``_PROFILE_COLUMNS`` list them) as evidence."""
    (
        profile_id,
        workload_id,
        device_id,
        device_key,
        received_at,
        created_at,
        max_micro_batch_size,
        headroom,
        size_cap,
        world_size,
        parallel,
        budget_bytes,
        strategy,
        fixed,
        per_sample,
        points,
        variant_group,
        variant_chosen,
        simulated_ranks,
    ) = row
    fit = (
        AffineFit(fixed_bytes=fixed, bytes_per_sample=per_sample, points=points or 0)
        if fixed is not None and per_sample is not None
        else None
    )
    return ProfileRow(
        id=profile_id,
        workload_id=workload_id,
        device_id=device_id,
        device_key=device_key,
        received_at=received_at if received_at is not None else created_at,
        created_at=created_at,
        max_micro_batch_size=max_micro_batch_size,
        headroom=headroom,
        size_cap=size_cap,
        world_size=world_size,
        parallel=_parallel(tuple(sorted((parallel or {}).items()))),
        budget_bytes=budget_bytes,
        strategy=strategy,
        fit=fit,
        variant_group=variant_group,
        variant_chosen=bool(variant_chosen),
        simulated_ranks=bool(simulated_ranks),
    )


@lru_cache(maxsize=256)
def _parallel(fields: tuple[tuple[str, Any], ...]) -> Parallel:
    """A stored ``parallel`` document, validated once: a store holds a handful of distinct
    ones, and validating each row's costs more than reading it."""
    return Parallel.model_validate(dict(fields))


def probe_result(row: Any) -> ProbeResult:
    """A probe's columns (as ``_PROBE_COLUMNS`` list them, without the profile id)."""
    size, fits, allocated, reserved, non_torch, phases, breakdown, speed = row
    return ProbeResult(
        micro_batch_size=size,
        fits=fits,
        peak_allocated_bytes=allocated,
        peak_reserved_bytes=reserved,
        non_torch_bytes=non_torch,
        phase_peaks_bytes=phases or {},
        breakdown=MemoryBreakdown.model_validate(breakdown) if breakdown else None,
        samples_per_second=speed,
    )


def profile_statement() -> Any:
    """Profiles with their device's key, as :func:`profile_row` reads them."""
    return select(*_PROFILE_COLUMNS).join(_D, _D.id == _P.device_id)


# Built once, with bound parameters: building a statement costs more than running it.
_REFERENCE: BindParameter[str] = bindparam("reference")
_PROJECT: BindParameter[int] = bindparam("project")
_IDS: BindParameter[list[int]] = bindparam("ids", expanding=True)
# Rows are found by reference within one project: other projects' rows of the same key or
# name are theirs. Profiles, probes and reports are then read by the ids found here.
_WORKLOADS = (
    select(*_WORKLOAD_COLUMNS)
    .where(_W.project_id == _PROJECT, or_(_W.key == _REFERENCE, _W.name == _REFERENCE))
    .order_by(_W.id)
)
_FAMILY = (
    select(*_WORKLOAD_COLUMNS)
    .where(_W.project_id == _PROJECT, _W.length_family == _REFERENCE)
    .order_by(_W.id)
)
_DEVICES = (
    select(*_DEVICE_COLUMNS)
    .where(_D.project_id == _PROJECT, or_(_D.key == _REFERENCE, _D.name == _REFERENCE))
    .order_by(_D.id)
)
_PROFILES = profile_statement().where(_P.workload_id.in_(_IDS))
_PROFILES_ON_DEVICE = _PROFILES.where(_P.device_id == bindparam("device_id"))
_PROBES = (
    select(*_PROBE_COLUMNS).where(_Pr.profile_id.in_(_IDS)).order_by(_Pr.profile_id, _Pr.ordinal)
)
_SPEEDS = select(_P.speeds).where(_P.id == bindparam("id"))
_OOM_REPORTS = select(
    _O.id,
    _O.workload_id,
    _O.device_id,
    _O.micro_batch_size,
    _O.created_at,
    _O.settled_micro_batch_size,
    _O.profile_id,
).where(_O.workload_id.in_(_IDS))


class SqlEvidence:
    """:class:`tuner.answer.Evidence` of one project over an ORM session, in its
    transaction. The reads select columns, not entities, so they run on the session's
    connection (SQLAlchemy Core): no identity map to fill for rows that are only read."""

    def __init__(self, session: Session, project_id: int) -> None:
        self.session = session
        self.project_id = project_id
        self._connection = session.connection()

    def workloads(self, reference: str) -> Sequence[WorkloadRow]:
        asked = {"reference": reference, "project": self.project_id}
        return [workload_row(row) for row in self._connection.execute(_WORKLOADS, asked)]

    def family(self, family: str) -> Sequence[WorkloadRow]:
        asked = {"reference": family, "project": self.project_id}
        return [workload_row(row) for row in self._connection.execute(_FAMILY, asked)]

    def devices(self, reference: str) -> Sequence[DeviceRow]:
        asked = {"reference": reference, "project": self.project_id}
        return [device_row(row) for row in self._connection.execute(_DEVICES, asked)]

    def profiles(
        self, workload_ids: Collection[int], *, device_id: int | None = None
    ) -> Sequence[ProfileRow]:
        if not workload_ids:
            return []
        ids = list(workload_ids)
        found = (
            self._connection.execute(_PROFILES, {"ids": ids})
            if device_id is None
            else self._connection.execute(_PROFILES_ON_DEVICE, {"ids": ids, "device_id": device_id})
        )
        return [profile_row(row) for row in found]

    def probes(self, profile_ids: Collection[int]) -> Mapping[int, Sequence[ProbeResult]]:
        if not profile_ids:
            return {}
        found: dict[int, list[ProbeResult]] = {i: [] for i in profile_ids}
        for row in self._connection.execute(_PROBES, {"ids": list(profile_ids)}):
            found[row[0]].append(probe_result(row[1:]))
        return found

    def oom_reports(self, workload_ids: Collection[int]) -> Sequence[OomRow]:
        if not workload_ids:
            return []
        rows = self._connection.execute(_OOM_REPORTS, {"ids": list(workload_ids)})
        return [OomRow(*row) for row in rows]

    def speeds(self, profile_id: int) -> SpeedCurve | None:
        stored = self._connection.execute(_SPEEDS, {"id": profile_id}).scalar()
        return SpeedCurve.model_validate(stored) if stored else None
