"""The rows a recommendation is answered from: reads only, no decisions.

What an answer *is* (measured or estimated, which estimate, the caveats and the refusals)
is decided in :mod:`api.answers.recommendation`; this module only reads. The common
question costs three indexed reads whatever the history holds: the workload and the device
by key or name, then, in one statement, the newest profile of the pair (one probe of a
unique index) with its own probes and the smallest OOM reported since.

Every training job asks this question at start-up, so the reads are prepared statements
run on the driver's connection (see ``api.store.prepared``): a fresh answer costs about
a tenth of what the same reads cost through ORM sessions.
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import BindParameter, Dialect, Select, bindparam, select
from sqlalchemy.orm import Session, lazyload

from api import models
from api.store.names import (
    NewestProfile,
    by_key,
    by_reference,
    family_statement,
    newest_profile_statement,
)
from api.store.oom_reports import smallest_limit
from api.store.prepared import PreparedSelect
from api.store.profiles import workload_info
from tuner.core import results
from tuner.core.parallel import Parallel

_P, _D, _W = models.Profile, models.Device, models.Workload


def _newest_measured_statement() -> Select[Any]:
    profile, probe, oom = models.Profile, models.Probe, models.OomReport
    workload_id: BindParameter[int] = bindparam("workload_id")
    device_id: BindParameter[int] = bindparam("device_id")
    newest = (
        select(profile.id)
        .where(
            profile.workload_id == workload_id,
            profile.device_id == device_id,
            profile.world_size == bindparam("world_size"),
            profile.tp == bindparam("tp"),
        )
        .order_by(profile.received_at.desc())
        .limit(1)
        .scalar_subquery()
    )
    smallest_oom = (
        select(smallest_limit(oom))
        .where(
            oom.workload_id == workload_id,
            oom.device_id == device_id,
            oom.created_at > profile.received_at,
        )
        .scalar_subquery()
    )
    return (
        select(
            profile.id,
            profile.created_at,
            profile.max_micro_batch_size,
            profile.headroom,
            smallest_oom,
            probe.micro_batch_size,
            probe.fits,
            probe.peak_reserved_bytes,
            probe.non_torch_bytes,
            probe.samples_per_second,
        )
        .outerjoin(probe, probe.profile_id == profile.id)
        .where(profile.id == newest)
        .order_by(probe.ordinal)
    )


def _newest_fit_statement(*columns: Any) -> Select[Any]:
    """The newest profile of the workload, on any device, whose fit can estimate sizes."""
    return (
        select(*columns)
        .where(
            _P.workload_id == bindparam("workload_id"),
            _P.fit_bytes_per_sample > 0,
            _P.fit_fixed_bytes.is_not(None),
        )
        .order_by(_P.received_at.desc(), _P.id.desc())
        .limit(1)
    )


# Built once, with bound parameters: constructing a statement costs more than SQLite
# takes to run it.
_NEWEST_FIT = _newest_fit_statement(_P).options(lazyload(_P.probes))


def newest_fit(session: Session, workload_id: int) -> models.Profile | None:
    """The newest profile of the workload, on any device, whose fit can estimate sizes."""
    row: models.Profile | None = session.scalar(_NEWEST_FIT, {"workload_id": workload_id})
    return row


class WorkloadRow(NamedTuple):
    """The columns of a workload an answer reads."""

    id: int
    key: str
    name: str
    target: str | None
    parallel_mode: str
    parameter_count: int
    precision: str
    optimizer: str
    activation_checkpointing: bool
    seq_len: int | None
    length_family: str | None
    registered_by: int | None


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


class DeviceRow(NamedTuple):
    """The columns of a device an answer reads."""

    id: int
    key: str
    name: str
    capacity_bytes: int
    kind: str


def _select(*columns: Any) -> Select[Any]:
    return select(*columns)


class _Reads:
    """The recommendation's statements, prepared for one dialect."""

    def __init__(self, dialect: Dialect) -> None:
        oom = models.OomReport
        # A training job asks by key: one probe of the unique index answers it, before the
        # statement that also finds a name's rows (a subquery for its owner, and an OR).
        self.workload_by_key = PreparedSelect(by_key(_W, *_WORKLOAD_COLUMNS), dialect)
        self.workload = PreparedSelect(by_reference(_W, *_WORKLOAD_COLUMNS), dialect)
        self.newest_profile = PreparedSelect(newest_profile_statement(), dialect)
        # The one-process workload a DDP or FSDP one was built from: the same name, model
        # and registrant (the mode is part of the key, so the keys differ; and no one
        # else's workload of that name can stand in for it).
        self.one_process_sibling = PreparedSelect(
            _select(*_WORKLOAD_COLUMNS)
            .where(
                _W.name == bindparam("name"),
                _W.parallel_mode == "none",
                _W.parameter_count == bindparam("parameter_count"),
                _W.precision == bindparam("precision"),
                _W.optimizer == bindparam("optimizer"),
                _W.activation_checkpointing == bindparam("activation_checkpointing"),
                _W.registered_by.is_not_distinct_from(bindparam("registered_by")),
            )
            .order_by(_W.created_at.desc())
            .limit(1),
            dialect,
        )
        self.family = PreparedSelect(family_statement(*_WORKLOAD_COLUMNS), dialect)
        self.world_profiles = PreparedSelect(_world_profiles_statement(), dialect)
        device_columns = (_D.id, _D.key, _D.name, _D.capacity_bytes, _D.kind)
        self.device_by_key = PreparedSelect(by_key(_D, *device_columns), dialect)
        self.device = PreparedSelect(by_reference(_D, *device_columns), dialect)
        self.newest_measured = PreparedSelect(_newest_measured_statement(), dialect)
        self.newest_fit = PreparedSelect(
            _newest_fit_statement(
                _P.id,
                _D.key,
                _P.created_at,
                _P.headroom,
                _P.size_cap,
                _P.fit_fixed_bytes,
                _P.fit_bytes_per_sample,
                _P.fit_points,
            ).join(_D, _D.id == _P.device_id),
            dialect,
        )
        # No profile of its own has lifted any OOM reported on this device.
        self.oom_ever = PreparedSelect(
            select(smallest_limit(oom)).where(
                oom.workload_id == bindparam("workload_id"),
                oom.device_id == bindparam("device_id"),
            ),
            dialect,
        )


_prepared: dict[str, _Reads] = {}
_prepared_lock = threading.Lock()


def _reads(dialect: Dialect) -> _Reads:
    reads = _prepared.get(dialect.name)
    if reads is None:
        with _prepared_lock:
            reads = _prepared.setdefault(dialect.name, _Reads(dialect))
    return reads


class Measured(NamedTuple):
    """The newest profile of a pair at one world size (and mesh shape), as a measured
    answer reads it."""

    profile_id: int
    created_at: datetime
    max_micro_batch_size: int
    headroom: float
    oom_limit: int | None  # the smallest OOM reported since it was received
    probes: list[results.ProbeResult]


class NewestFit(NamedTuple):
    """The newest profile of a workload, on any device, whose fit can estimate sizes."""

    profile_id: int
    device_key: str
    created_at: datetime
    headroom: float
    size_cap: int | None
    fit: results.AffineFit


class RecommendationRows:
    """The reads a recommendation makes, on one DBAPI connection of one dialect, in its
    current transaction."""

    __slots__ = ("_connection", "_reads")

    def __init__(self, connection: Any, dialect: Dialect) -> None:
        self._reads = _reads(dialect)
        self._connection = connection

    @classmethod
    def in_session(cls, session: Session) -> RecommendationRows:
        """The reads in the session's transaction."""
        connection = session.connection()
        return cls(connection.connection.driver_connection, connection.dialect)

    def workloads(self, reference: str) -> list[WorkloadRow]:
        """The workload keyed ``reference``, else the rows its name may mean."""
        reads, connection = self._reads, self._connection
        found = reads.workload_by_key.rows(connection, ref=reference) or reads.workload.rows(
            connection, ref=reference
        )
        return [WorkloadRow(*row) for row in found]

    def family(self, family: str) -> list[WorkloadRow]:
        """The workloads of a length family (its owner's)."""
        return [
            WorkloadRow(*row) for row in self._reads.family.rows(self._connection, family=family)
        ]

    def newest_profile(self, workload_id: int) -> NewestProfile | None:
        """What the choice among a name's workloads reads of each one's newest profile."""
        found = self._reads.newest_profile.rows(self._connection, workload_id=workload_id)
        if not found:
            return None
        row = found[0]
        return (row[0], row[1], row[2], row[3], bool(row[4]))

    def devices(self, reference: str) -> list[DeviceRow]:
        """The device keyed ``reference``, else the rows its name may mean."""
        reads, connection = self._reads, self._connection
        found = reads.device_by_key.rows(connection, ref=reference) or reads.device.rows(
            connection, ref=reference
        )
        return [DeviceRow(*row) for row in found]

    def newest_measured(
        self, workload_id: int, device_id: int, world_size: int, tp: int = 1
    ) -> Measured | None:
        """The newest profile of the pair at ``world_size`` ranks as ``world_size / tp × tp``
        with its probes, if any."""
        measured = self._reads.newest_measured.rows(
            self._connection,
            workload_id=workload_id,
            device_id=device_id,
            world_size=world_size,
            tp=tp,
        )
        if not measured:
            return None
        profile_id, created_at, max_micro_batch_size, headroom, limit = measured[0][:5]
        return Measured(
            profile_id, created_at, max_micro_batch_size, headroom, limit, _plan_probes(measured)
        )

    def newest_fit(self, workload_id: int) -> NewestFit | None:
        """The workload's newest fit on any device, if one can estimate sizes."""
        fitted = self._reads.newest_fit.rows(self._connection, workload_id=workload_id)
        if not fitted:
            return None
        profile_id, device_key, created_at, headroom, size_cap, fixed, per_sample, points = fitted[
            0
        ]
        fit = results.AffineFit(fixed_bytes=fixed, bytes_per_sample=per_sample, points=points or 0)
        return NewestFit(profile_id, device_key, created_at, headroom, size_cap, fit)

    def oom_ever(self, workload_id: int, device_id: int) -> int | None:
        """The smallest OOM ever reported for the pair (no profile of its own lifted it)."""
        row = self._reads.oom_ever.rows(
            self._connection, workload_id=workload_id, device_id=device_id
        )
        limit: int | None = row[0][0]
        return limit

    def world_profiles(self, workload: WorkloadRow, device: DeviceRow) -> list[StoredProfile]:
        """The pair's newest profile at each world size and mesh shape, smallest first."""
        rows = self._reads.world_profiles.rows(
            self._connection, workload_id=workload.id, device_id=device.id
        )
        return _newest_per_world_size(rows, workload, device)

    def one_process_sibling(self, workload: WorkloadRow) -> WorkloadRow | None:
        """The one-process workload a DDP or FSDP one was built from, if stored."""
        rows = self._reads.one_process_sibling.rows(
            self._connection,
            name=workload.name,
            parameter_count=workload.parameter_count,
            precision=workload.precision,
            optimizer=workload.optimizer,
            activation_checkpointing=workload.activation_checkpointing,
            registered_by=workload.registered_by,
        )
        return WorkloadRow(*rows[0]) if rows else None


def _plan_probes(measured: list[Any]) -> list[results.ProbeResult]:
    """Only what the plan reads of each probe: size, verdict, peak and speed."""
    return [
        results.ProbeResult(
            micro_batch_size=row[5],
            fits=row[6],
            peak_reserved_bytes=row[7],
            non_torch_bytes=row[8],
            samples_per_second=row[9],
        )
        for row in measured
        if row[5] is not None
    ]


def _world_profiles_statement() -> Select[Any]:
    """Every profile of the pair with the probe columns the fit across world sizes reads,
    newest first."""
    probe = models.Probe
    return (
        select(
            _P.id,
            _P.created_at,
            _P.world_size,
            _P.parallel,
            _P.max_micro_batch_size,
            _P.headroom,
            _P.budget_bytes,
            _P.strategy,
            _P.size_cap,
            probe.micro_batch_size,
            probe.fits,
            probe.peak_allocated_bytes,
            probe.peak_reserved_bytes,
            probe.non_torch_bytes,
            probe.phase_peaks_bytes,
        )
        .outerjoin(probe, probe.profile_id == _P.id)
        .where(_P.workload_id == bindparam("workload_id"), _P.device_id == bindparam("device_id"))
        .order_by(_P.received_at.desc(), _P.id.desc(), probe.ordinal)
    )


class StoredProfile(NamedTuple):
    """A profile as the fits across world sizes and lengths read it."""

    id: int
    profile: results.Profile
    received: int  # its place in the order the service received the pair's profiles: 0 newest


def _newest_per_world_size(
    rows: list[Any], workload: WorkloadRow, device: DeviceRow
) -> list[StoredProfile]:
    """The newest profile at each world size and mesh shape ``(world_size, tp)``, as much
    of it as the fit reads."""
    probes: dict[int, list[results.ProbeResult]] = {}
    heads: dict[int, Any] = {}
    for row in rows:
        heads.setdefault(row[0], row)
        if row[9] is not None:
            probes.setdefault(row[0], []).append(
                results.ProbeResult(
                    micro_batch_size=row[9],
                    fits=row[10],
                    peak_allocated_bytes=row[11],
                    peak_reserved_bytes=row[12],
                    non_torch_bytes=row[13],
                    phase_peaks_bytes=row[14] or {},
                )
            )
    newest: dict[tuple[int, int], StoredProfile] = {}
    # Newest first (received last), so the first at a shape stays.
    for received, (profile_id, head) in enumerate(heads.items()):
        world_size = head[2]
        parallel = Parallel.model_validate(head[3])
        if (world_size, parallel.tp) in newest:
            continue
        newest[world_size, parallel.tp] = StoredProfile(
            profile_id,
            results.Profile(
                workload_key=workload.key,
                device_key=device.key,
                workload=workload_info(workload),
                device=results.DeviceInfo(
                    kind="unknown", name=device.name, capacity_bytes=device.capacity_bytes
                ),
                created_at=head[1],
                world_size=world_size,
                parallel=parallel,
                max_micro_batch_size=head[4],
                headroom=head[5],
                budget_bytes=head[6],
                strategy=head[7],
                size_cap=head[8],
                probes=probes.get(profile_id, []),
                fit=None,
                settings=results.ProbeSettings(),
                wall_time_s=0.0,
            ),
            received,
        )
    return sorted(
        newest.values(), key=lambda stored: (stored.profile.world_size, stored.profile.parallel.tp)
    )
