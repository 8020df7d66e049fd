"""The evidence an answer is decided from: stored rows, as plain values, and the reads
that gather them.

A store (the service's SQL store, or :class:`MemoryEvidence` for profiles held in this
process) implements :class:`Evidence` with plain reads: rows whose key or name equals a
reference, the profiles of some workloads, the probes of some profiles, the OOM reports of
some workloads. It decides nothing: which of those rows a question means, which profile is
current and what caps it are :mod:`tuner.answer`'s decisions.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from tuner.core.parallel import Parallel
from tuner.core.results import AffineFit, ProbeResult, Profile, WorkloadInfo
from tuner.core.shape import MeshShape
from tuner.core.speeds import SpeedCurve


@dataclass(frozen=True, slots=True)
class WorkloadRow:
    """A stored workload: its identity (key, name, family) and what it was built as."""

    id: int
    key: str
    name: str
    target: str | None = None
    parallel_mode: str = "none"
    parameter_count: int = 0
    precision: str = "fp32"
    optimizer: str = ""
    activation_checkpointing: bool = False
    seq_len: int | None = None
    length_family: str | None = None
    registered_by: int | None = None  # the token that stored it first


@dataclass(frozen=True, slots=True)
class DeviceRow:
    """A stored device."""

    id: int
    key: str
    name: str
    capacity_bytes: int
    kind: str = "cpu"
    registered_by: int | None = None


@dataclass(frozen=True, slots=True)
class ProfileRow:
    """A stored profile without its probes: what decides whether it is current."""

    id: int
    workload_id: int
    device_id: int
    device_key: str
    received_at: datetime  # when the service stored it: "newest" is by this, then by id
    created_at: datetime  # when it was measured
    max_micro_batch_size: int
    headroom: float
    size_cap: int
    world_size: int = 1
    parallel: Parallel = field(default_factory=Parallel)
    budget_bytes: int = 0
    strategy: str = ""
    fit: AffineFit | None = None
    variant_group: str | None = None
    variant_chosen: bool = False
    # One process stood for rank 0 of a fake world: memory measured, speed not (its
    # collectives moved no data).
    simulated_ranks: bool = False

    @property
    def mesh(self) -> MeshShape:
        return MeshShape(self.world_size, self.parallel.tp)

    @property
    def recency(self) -> tuple[datetime, int]:
        """The order of "newest": received last, then stored last."""
        return (self.received_at, self.id)


@dataclass(frozen=True, slots=True)
class OomRow:
    """An out-of-memory report from training."""

    id: int
    workload_id: int
    device_id: int
    micro_batch_size: int
    created_at: datetime
    settled_micro_batch_size: int | None = None
    profile_id: int | None = None  # the profile the reported plan came from, when known

    @property
    def limit(self) -> int:
        """The size answers stay below: ``min(settled + 1, failed)``."""
        if self.settled_micro_batch_size is None:
            return self.micro_batch_size
        return min(self.settled_micro_batch_size + 1, self.micro_batch_size)


class WorkloadColumns(Protocol):
    """What a stored workload says of itself: a row, or the same columns."""

    @property
    def name(self) -> str: ...
    @property
    def target(self) -> str | None: ...
    @property
    def precision(self) -> str: ...
    @property
    def activation_checkpointing(self) -> bool: ...
    @property
    def parameter_count(self) -> int: ...
    @property
    def optimizer(self) -> str: ...
    @property
    def seq_len(self) -> int | None: ...
    @property
    def length_family(self) -> str | None: ...


def workload_info(workload: WorkloadColumns) -> WorkloadInfo:
    """What the engine's schema says of a stored workload (a row, or the same columns)."""
    return WorkloadInfo(
        name=workload.name,
        target=workload.target,
        precision=workload.precision,
        activation_checkpointing=workload.activation_checkpointing,
        parameter_count=workload.parameter_count,
        optimizer=workload.optimizer,
        seq_len=workload.seq_len,
        length_family=workload.length_family,
    )


class Evidence(Protocol):
    """Plain reads of a store: no read chooses among the rows it returns."""

    def workloads(self, reference: str) -> Sequence[WorkloadRow]:
        """Every workload whose key or name is ``reference``, oldest first."""
        ...

    def family(self, family: str) -> Sequence[WorkloadRow]:
        """Every workload of the length family ``family``, oldest first."""
        ...

    def devices(self, reference: str) -> Sequence[DeviceRow]:
        """Every device whose key or name is ``reference``, oldest first."""
        ...

    def profiles(
        self, workload_ids: Collection[int], *, device_id: int | None = None
    ) -> Sequence[ProfileRow]:
        """Every profile of these workloads, on every device or on ``device_id``."""
        ...

    def probes(self, profile_ids: Collection[int]) -> Mapping[int, Sequence[ProbeResult]]:
        """The probes of these profiles, in the order they ran."""
        ...

    def oom_reports(self, workload_ids: Collection[int]) -> Sequence[OomRow]:
        """Every OOM report of these workloads."""
        ...

    def speeds(self, profile_id: int) -> SpeedCurve | None:
        """The speed curve the profile was timed with, if any (read for the one profile an
        answer comes from, not for every row a question looks at)."""
        ...


class MemoryEvidence:
    """Evidence held in this process: rows built from profiles in hand (a plan made
    offline, tests)."""

    def __init__(
        self,
        *,
        workloads: Iterable[WorkloadRow] = (),
        devices: Iterable[DeviceRow] = (),
        profiles: Iterable[tuple[ProfileRow, Sequence[ProbeResult]]] = (),
        oom_reports: Iterable[OomRow] = (),
    ) -> None:
        self._workloads = sorted(workloads, key=lambda row: row.id)
        self._devices = sorted(devices, key=lambda row: row.id)
        self._profiles = [row for row, _ in profiles]
        self._probes = {row.id: list(probes) for row, probes in profiles}
        self._ooms = list(oom_reports)
        self._speeds: dict[int, SpeedCurve] = {}
        for row in self._profiles:
            self._probes.setdefault(row.id, [])

    @classmethod
    def of_profiles(
        cls, profiles: Sequence[Profile], *, received_at: datetime | None = None
    ) -> MemoryEvidence:
        """Evidence of profiles in hand, each its workload's and device's only rows; the
        later a profile in ``profiles``, the newer."""
        workloads: dict[str, WorkloadRow] = {}
        devices: dict[str, DeviceRow] = {}
        rows: list[tuple[ProfileRow, Sequence[ProbeResult]]] = []
        for index, profile in enumerate(profiles, start=1):
            info = profile.workload
            workload = workloads.setdefault(
                profile.workload_key,
                WorkloadRow(
                    id=len(workloads) + 1,
                    key=profile.workload_key,
                    name=info.name,
                    target=info.target,
                    parallel_mode=profile.parallel.mode,
                    parameter_count=info.parameter_count,
                    precision=info.precision,
                    optimizer=info.optimizer,
                    activation_checkpointing=info.activation_checkpointing,
                    seq_len=info.seq_len,
                    length_family=info.length_family,
                ),
            )
            device = devices.setdefault(
                profile.device_key,
                DeviceRow(
                    id=len(devices) + 1,
                    key=profile.device_key,
                    name=profile.device.name,
                    capacity_bytes=profile.device.capacity_bytes,
                    kind=profile.device.kind,
                ),
            )
            row = ProfileRow(
                id=index,
                workload_id=workload.id,
                device_id=device.id,
                device_key=device.key,
                received_at=received_at or profile.created_at,
                created_at=profile.created_at,
                max_micro_batch_size=profile.max_micro_batch_size,
                headroom=profile.headroom,
                size_cap=profile.size_cap,
                world_size=profile.world_size,
                parallel=profile.parallel,
                budget_bytes=profile.budget_bytes,
                strategy=profile.strategy,
                fit=profile.fit,
                variant_group=profile.variant_group,
                variant_chosen=profile.variant_chosen,
                simulated_ranks=profile.settings.simulated_ranks,
            )
            rows.append((row, profile.probes))
        evidence = cls(workloads=workloads.values(), devices=devices.values(), profiles=rows)
        evidence._speeds = {
            index: profile.speeds
            for index, profile in enumerate(profiles, start=1)
            if profile.speeds is not None
        }
        return evidence

    def workloads(self, reference: str) -> Sequence[WorkloadRow]:
        return [row for row in self._workloads if reference in (row.key, row.name)]

    def family(self, family: str) -> Sequence[WorkloadRow]:
        return [row for row in self._workloads if row.length_family == family]

    def devices(self, reference: str) -> Sequence[DeviceRow]:
        return [row for row in self._devices if reference in (row.key, row.name)]

    def profiles(
        self, workload_ids: Collection[int], *, device_id: int | None = None
    ) -> Sequence[ProfileRow]:
        return [
            row
            for row in self._profiles
            if row.workload_id in workload_ids and device_id in (None, row.device_id)
        ]

    def probes(self, profile_ids: Collection[int]) -> Mapping[int, Sequence[ProbeResult]]:
        return {i: self._probes[i] for i in profile_ids if i in self._probes}

    def oom_reports(self, workload_ids: Collection[int]) -> Sequence[OomRow]:
        return [row for row in self._ooms if row.workload_id in workload_ids]

    def speeds(self, profile_id: int) -> SpeedCurve | None:
        return self._speeds.get(profile_id)
