"""The recommendation for a workload on a device, and the OOM reports that lower it.

Three indexed reads whatever the history holds: the workload and the device by key or
name, then, in one statement, the newest profile of the pair (one probe of a unique
index) with its own probes and the smallest OOM reported since. A device without a
profile of its own gets an estimate from the newest fit of the workload on another device.

Every training job asks this question at start-up, so the reads are prepared statements
run on the driver's connection (see ``api.store.prepared``): a fresh answer costs about
a tenth of what the same reads cost through ORM sessions.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import BindParameter, Dialect, Select, bindparam, select
from sqlalchemy.orm import Session, lazyload

from api import models
from api.schemas.recommendation import RecommendationPublic, RecommendationQuery
from api.store.names import (
    NewestProfile,
    by_key,
    by_reference,
    choose_device,
    choose_workload,
    family_statement,
    newest_profile_statement,
)
from api.store.oom_reports import smallest_limit
from api.store.prepared import PreparedSelect
from api.store.profiles import workload_info
from tuner.core import lengths as lengths_fit
from tuner.core import plan, results, worlds
from tuner.core.errors import BadInputError, NotFoundError, NothingFitsError
from tuner.core.parallel import PARALLEL_MODES, Parallel, ParallelMode

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


class _Workload(NamedTuple):
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


class _Device(NamedTuple):
    id: int
    key: str
    name: str
    capacity_bytes: int
    kind: str

    def profile_command(self, workload: _Workload, *flags: str) -> str:
        """The ``tuner profile`` command that measures ``workload`` on this device, as a
        person runs it: a CPU device is its memory limit, which the command needs."""
        device = (
            ["--device", "cpu", "--memory-limit", str(self.capacity_bytes)]
            if self.kind == "cpu"
            else []
        )
        return " ".join(["tuner profile", workload.target or "TARGET", *device, *flags, "--upload"])


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


@dataclass(frozen=True)
class Source:
    """The profile a recommendation rests on."""

    profile_id: int
    device_key: str
    created_at: datetime
    headroom: float
    world_size: int = 1
    parallel: ParallelMode = "none"


def recommend(
    session: Session, query: RecommendationQuery, *, now: datetime
) -> RecommendationPublic:
    """Measured from the newest profile of the pair, else estimated from another device,
    read in the session's transaction."""
    connection = session.connection()
    return recommend_on(connection.connection.driver_connection, connection.dialect, query, now=now)


def recommend_on(
    connection: Any, dialect: Dialect, query: RecommendationQuery, *, now: datetime
) -> RecommendationPublic:
    """:func:`recommend` on a DBAPI connection of ``dialect``, in its current transaction.

    The run's parallel mode is the query's, else the workload's own. One process: the
    newest profile of the pair, else an estimate from another device. DDP or FSDP: the
    newest profile at the run's world size, else the fit across the world sizes measured
    (``estimated``), else the one-process profile with a caveat that says what it misses.
    """
    reads = _reads(dialect)
    found = reads.workload_by_key.rows(connection, ref=query.workload) or reads.workload.rows(
        connection, ref=query.workload
    )
    rows = [_Workload(*row) for row in found]
    if not rows and query.seq_len is not None:  # named by its length family's key
        rows = [_Workload(*row) for row in reads.family.rows(connection, family=query.workload)]
        rows = sorted(rows, key=lambda row: row.seq_len or 0)[-1:]

    def newest_of(workload_id: int) -> NewestProfile | None:
        found = reads.newest_profile.rows(connection, workload_id=workload_id)
        return None if not found else (found[0][0], found[0][1], found[0][2], found[0][3])

    workload = choose_workload(
        rows, query.workload, newest_of, mode=query.parallel, seq_len=query.seq_len
    )
    devices = reads.device_by_key.rows(connection, ref=query.device) or reads.device.rows(
        connection, ref=query.device
    )
    device = choose_device([_Device(*row) for row in devices], query.device)
    mode = query.parallel or _mode(workload.parallel_mode)
    answer = _Answering(reads, connection, query, workload, device, mode, now)
    if query.seq_len is not None:
        return answer.by_length(query.seq_len)
    return answer.for_workload()


def _mode(stored: str) -> ParallelMode:
    if stored not in PARALLEL_MODES:
        raise ValueError(f"stored parallel mode {stored!r} is not one of {PARALLEL_MODES}")
    return stored  # type: ignore[return-value]


# What a one-process profile misses of a parallel run, said to whoever asks for one.
_MISSES = {
    "ddp": "a DDP rank also holds the all-reduce buckets (a second copy of the gradients "
    "unless gradient_as_bucket_view zeroes them in place), so the micro batch may run out "
    "of memory",
    "fsdp": "an FSDP rank holds shards of parameters, gradients and optimizer state but "
    "all-gathers whole layers (and, syncing on the last micro batch, keeps unsharded "
    "gradients), so its largest micro batch can be larger or smaller",
}


@dataclass(slots=True)
class _Answering:
    """One question, once its workload, device and parallel mode are known (built for
    every answer not cached: slots, not frozen, which costs a third as much)."""

    reads: _Reads
    connection: Any
    query: RecommendationQuery
    workload: _Workload
    device: _Device
    mode: ParallelMode
    now: datetime

    def for_workload(self) -> RecommendationPublic:
        """The answer from the workload's own profiles, by the run's parallel mode."""
        w, mode = self.workload, self.mode
        if mode == "none":
            if w.parallel_mode != "none":
                raise BadInputError(
                    f"workload {w.name!r} ({w.key}) is measured under "
                    f"{w.parallel_mode}: ask with parallel={w.parallel_mode}, or name "
                    "the one-process workload"
                )
            return self.one_process(w)
        if w.parallel_mode == mode:
            found = self.across_world_sizes()
            if found is not None:
                return found
            sibling = self.sibling()
            if sibling is None:
                raise NotFoundError(
                    f"workload {w.name!r} ({w.key}) has no {mode} profile on device "
                    f"{self.device.name!r} ({self.device.key}), and no one-process profile to "
                    "warn from: profile it "
                    f"(`{self.device.profile_command(w, *self.ranks_flags())}`) or queue a job "
                    "for it"
                )
            return self.with_caveat(self.one_process(sibling))
        if w.parallel_mode == "none":
            return self.with_caveat(self.one_process(w))
        raise BadInputError(
            f"workload {w.name!r} ({w.key}) is measured under "
            f"{w.parallel_mode}, not {mode}: ask with parallel={w.parallel_mode}, or "
            f"profile it under {mode}"
        )

    def one_process(self, workload: _Workload) -> RecommendationPublic:
        """Measured from the newest one-process profile of the pair, else estimated from
        the workload's newest fit on another device."""
        query, device, connection = self.query, self.device, self.connection
        pair = {"workload_id": workload.id, "device_id": device.id}
        found = self._measured(workload, world_size=1, parallel="none")
        if found is not None:
            return found
        fitted = self.reads.newest_fit.rows(connection, workload_id=workload.id)
        if not fitted:
            raise NotFoundError(
                f"workload {workload.name!r} ({workload.key}) has no profile on device "
                f"{device.name!r} ({device.key}), and none on another device to estimate "
                "from: profile it on this device "
                f"(`{device.profile_command(workload)}`) or queue a job for it"
            )
        profile_id, device_key, created_at, headroom, size_cap, fixed, per_sample, points = fitted[
            0
        ]
        limit = self.reads.oom_ever.rows(connection, **pair)[0][0]
        chosen = plan.recommend_estimated(
            results.AffineFit(fixed_bytes=fixed, bytes_per_sample=per_sample, points=points or 0),
            capacity_bytes=device.capacity_bytes,
            headroom=headroom,
            size_cap=size_cap,
            global_batch_size=query.global_batch_size,
            world_size=query.world_size,
            policy=query.policy,
            oom_limit=self._below(limit),
        )
        return self._public(
            chosen, workload, Source(profile_id, device_key, created_at, headroom), limit
        )

    def across_world_sizes(self) -> RecommendationPublic | None:
        """Measured at the run's world size, else estimated from the fit across the world
        sizes measured on this device; ``None`` when none was."""
        query, workload, device = self.query, self.workload, self.device
        pair = {"workload_id": workload.id, "device_id": device.id}
        found = self._measured(workload, world_size=query.world_size, parallel=self.mode)
        if found is not None:
            return found
        profiles = _newest_per_world_size(
            self.reads.world_profiles.rows(self.connection, **pair), workload, device
        )
        if not profiles:
            return None
        limit = self.reads.oom_ever.rows(self.connection, **pair)[0][0]
        estimate = _estimate(profiles, query.world_size, self.mode)
        if estimate.max_micro_batch_size < 1:
            raise NothingFitsError(
                f"estimated from world sizes {estimate.world_sizes}, not even a micro batch "
                f"of 1 fits at world size {query.world_size}: profile at this world size to "
                "measure it"
            )
        chosen = self._estimated_plan(
            estimate.max_micro_batch_size, estimate.expected_peak_bytes, limit
        )
        newest = min(estimate.based_on, key=lambda stored: stored.received)
        source = Source(
            newest.id,
            device.key,
            newest.profile.created_at,
            newest.profile.headroom,
            newest.profile.world_size,
            self.mode,
        )
        return self._public(
            chosen,
            workload,
            source,
            limit,
            based_on=[stored.id for stored in estimate.based_on],
            expected_error=estimate.expected_error,
            caveat=estimate.caveat,
        )

    def _below(self, limit: int | None) -> int | None:
        """The size the plan stays below: the OOM limit, and for packed sequences one past
        the sequences a micro batch's tokens hold (the plan then never exceeds them)."""
        query = self.query
        if query.tokens_per_micro_batch is None or query.seq_len is None:
            return limit
        above_budget = query.tokens_per_micro_batch // query.seq_len + 1
        return above_budget if limit is None else min(limit, above_budget)

    def by_length(self, seq_len: int) -> RecommendationPublic:
        """For sequences of ``seq_len`` tokens: from the family member profiled at that
        length, else estimated from the fit across the family's measured lengths."""
        workload = self.workload
        if workload.length_family is None:
            if workload.seq_len == seq_len:
                return self._with_length(self.for_workload(), "measured", [seq_len])
            measured = (
                f"at seq_len {workload.seq_len} only" if workload.seq_len else "for one shape"
            )
            raise BadInputError(
                f"workload {workload.name!r} ({workload.key}) was profiled {measured}, not "
                "as a family of lengths: profile it at several (`"
                f"{self.device.profile_command(workload, '--seq-lens', '512,1024,2048')}`) to "
                "ask for other lengths"
            )
        members = {
            member.seq_len: member
            for member in map(
                _Workload._make,
                self.reads.family.rows(self.connection, family=workload.length_family),
            )
            if member.seq_len is not None
        }
        if seq_len in members:
            at_length = replace(self, workload=members[seq_len])
            return at_length._with_length(at_length.for_workload(), "measured", [seq_len])
        return self._with_length(*self._across_lengths(seq_len, members))

    def _across_lengths(
        self, seq_len: int, members: dict[int, _Workload]
    ) -> tuple[RecommendationPublic, plan.Basis, list[int]]:
        """Estimated from the newest profile of each measured length on this device, at
        the run's world size."""
        world_size = 1 if self.mode == "none" else self.query.world_size
        measured: dict[int, _Stored] = {}
        for length, member in sorted(members.items()):
            rows = self.reads.world_profiles.rows(
                self.connection, workload_id=member.id, device_id=self.device.id
            )
            for newest in _newest_per_world_size(rows, member, self.device):
                if newest.profile.world_size == world_size:
                    measured[length] = newest
        if len(measured) < 2:
            have = ", ".join(map(str, measured)) or "none"
            suggested = _suggested_lengths(seq_len, list(measured))
            raise NotFoundError(
                f"seq_len {seq_len} was not profiled on device {self.device.name!r} "
                f"({self.device.key}) at world size {world_size}, and an estimate needs two "
                f"or more measured lengths there (measured: {have}): profile it "
                f"(`{self.device.profile_command(self.workload, '--seq-lens', suggested)}`)"
            )
        lengths = list(measured)
        based_on = list(measured.values())
        estimate = lengths_fit.estimate_length([s.profile for s in based_on], lengths, seq_len)
        if estimate.max_micro_batch_size < 1:
            raise NothingFitsError(
                f"estimated from seq_len {', '.join(map(str, lengths))}, not even one "
                f"sequence of {seq_len} tokens fits on device {self.device.name!r}: shorten "
                "the sequences, or profile this length to measure it"
            )
        chosen = self._estimated_plan(
            estimate.max_micro_batch_size, estimate.expected_peak_bytes or None, None
        )
        longest = based_on[-1]  # the measured length nearest to what binds
        source = Source(
            longest.id,
            self.device.key,
            longest.profile.created_at,
            longest.profile.headroom,
            world_size,
            self.mode,
        )
        answer = self._public(
            chosen,
            self.workload,
            source,
            None,
            based_on=[s.id for s in based_on],
            expected_error=estimate.fit.max_relative_error if estimate.fit else None,
        )
        return answer, "estimated", lengths

    def _with_length(
        self, answer: RecommendationPublic, basis: plan.Basis, lengths: list[int]
    ) -> RecommendationPublic:
        """``answer`` for sequences of the asked length, in tokens too; refused when a packed
        micro batch's tokens do not fit."""
        query = self.query
        seq_len = query.seq_len or 0
        tokens = query.tokens_per_micro_batch
        if tokens is not None and answer.max_micro_batch_size < tokens // seq_len:
            raise BadInputError(
                f"a micro batch of {tokens} tokens ({tokens // seq_len} sequences of {seq_len}) "
                f"does not fit on device {self.device.name!r}: at most "
                f"{answer.max_micro_batch_size * seq_len} tokens do "
                f"({answer.max_micro_batch_size} sequences): pack at most that many per micro batch"
            )
        return answer.model_copy(
            update={
                "seq_len": seq_len,
                "length_family": self.workload.length_family,
                "length_basis": basis,
                "measured_seq_lens": lengths,
                "tokens_per_micro_batch": answer.micro_batch_size * seq_len,
                "max_tokens_per_micro_batch": answer.max_micro_batch_size * seq_len,
            }
        )

    def _estimated_plan(
        self, max_micro_batch_size: int, peak_bytes: int | None, limit: int | None
    ) -> plan.Recommendation:
        """The plan from an estimated ``M*`` whose own peak is ``peak_bytes``."""
        device, query = self.device, self.query
        chosen = plan.recommend_measured(
            max_micro_batch_size=max_micro_batch_size,
            probes=(),
            capacity_bytes=device.capacity_bytes,
            global_batch_size=query.global_batch_size,
            world_size=query.world_size,
            policy=query.policy,
            oom_limit=self._below(limit),
        )
        # The estimate's peak is for its own size M*; a smaller choice (an OOM limit, the
        # batch) peaks no higher, so that figure bounds it, as a measured plan's does.
        peak = peak_bytes
        return chosen.model_copy(
            update={
                "basis": "estimated",
                "expected_peak_bytes": peak,
                "expected_headroom_bytes": device.capacity_bytes - peak if peak else None,
            }
        )

    def _measured(
        self, workload: _Workload, *, world_size: int, parallel: ParallelMode
    ) -> RecommendationPublic | None:
        """From the newest profile of the pair measured at ``world_size``, if any."""
        measured = self.reads.newest_measured.rows(
            self.connection,
            workload_id=workload.id,
            device_id=self.device.id,
            world_size=world_size,
        )
        if not measured:
            return None
        profile_id, created_at, max_micro_batch_size, headroom, limit = measured[0][:5]
        chosen = plan.recommend_measured(
            max_micro_batch_size=max_micro_batch_size,
            probes=_plan_probes(measured),
            capacity_bytes=self.device.capacity_bytes,
            global_batch_size=self.query.global_batch_size,
            world_size=self.query.world_size,
            policy=self.query.policy,
            oom_limit=self._below(limit),
        )
        source = Source(profile_id, self.device.key, created_at, headroom, world_size, parallel)
        return self._public(chosen, workload, source, limit)

    def sibling(self) -> _Workload | None:
        """The one-process workload this DDP or FSDP workload was built from, if stored."""
        w = self.workload
        rows = self.reads.one_process_sibling.rows(
            self.connection,
            name=w.name,
            parameter_count=w.parameter_count,
            precision=w.precision,
            optimizer=w.optimizer,
            activation_checkpointing=w.activation_checkpointing,
            registered_by=w.registered_by,
        )
        return _Workload(*rows[0]) if rows else None

    def ranks_flags(self) -> tuple[str, ...]:
        """The flags that profile the run's ranks as it trains."""
        return ("--world-size", str(self.query.world_size), "--parallel", self.mode)

    def with_caveat(self, answer: RecommendationPublic) -> RecommendationPublic:
        """A one-process answer for a DDP or FSDP run: ``estimated``, and saying why."""
        ranks = f"{self.query.world_size} rank{'s' if self.query.world_size != 1 else ''}"
        caveat = (
            f"this workload was only measured in one process, not under {self.mode} on "
            f"{ranks}: {_MISSES[self.mode]}; profile it as it trains "
            f"(`{self.device.profile_command(self.workload, *self.ranks_flags())}`)"
        )
        return answer.model_copy(
            update={"basis": "estimated", "one_process_only": True, "caveat": caveat}
        )

    def _public(
        self,
        chosen: plan.Recommendation,
        workload: _Workload,
        source: Source,
        limit: int | None,
        *,
        based_on: list[int] | None = None,
        expected_error: float | None = None,
        caveat: str | None = None,
    ) -> RecommendationPublic:
        return RecommendationPublic(
            **chosen.model_dump(),
            parallel=self.mode,
            workload_key=workload.key,
            workload_name=workload.name,
            device_key=self.device.key,
            device_name=self.device.name,
            capacity_bytes=self.device.capacity_bytes,
            headroom=source.headroom,
            oom_limit=limit,
            profile_id=source.profile_id,
            profile_device_key=source.device_key,
            profile_world_size=source.world_size,
            profile_parallel=source.parallel,
            profile_created_at=source.created_at,
            profile_age_s=max(0.0, (self.now - source.created_at).total_seconds()),
            based_on_profiles=based_on or [source.profile_id],
            expected_error=expected_error,
            caveat=caveat,
        )


def _suggested_lengths(seq_len: int, measured: list[int]) -> str:
    """Lengths to profile so that ``seq_len`` is measured and a fit has three points."""
    lengths = sorted({seq_len, *measured})
    for factor in (2, 4):
        if len(lengths) >= 3:
            break
        lengths = sorted({*lengths, seq_len // factor or 1})
    return ",".join(map(str, lengths))


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


class _Stored(NamedTuple):
    id: int
    profile: results.Profile
    received: int  # its place in the order the service received the pair's profiles: 0 newest


def _newest_per_world_size(rows: list[Any], workload: _Workload, device: _Device) -> list[_Stored]:
    """The newest profile at each world size, as much of it as the fit reads."""
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
    newest: dict[int, _Stored] = {}
    # Newest first (received last), so the first at a size stays.
    for received, (profile_id, head) in enumerate(heads.items()):
        world_size = head[2]
        if world_size in newest:
            continue
        newest[world_size] = _Stored(
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
                parallel=Parallel.model_validate(head[3]),
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
    return sorted(newest.values(), key=lambda stored: stored.profile.world_size)


class _Estimate(NamedTuple):
    max_micro_batch_size: int
    expected_peak_bytes: int | None
    based_on: list[_Stored]
    expected_error: float | None
    caveat: str | None

    @property
    def world_sizes(self) -> str:
        return ", ".join(str(stored.profile.world_size) for stored in self.based_on)


def _estimate(profiles: list[_Stored], world_size: int, mode: str) -> _Estimate:
    """From the fit across two or more world sizes; from one smaller world size, its own
    M* (a rank's memory does not grow with the world size, so it still fits)."""
    if len(profiles) >= 2:
        found = worlds.estimate_world_size([stored.profile for stored in profiles], world_size)
        return _Estimate(
            found.max_micro_batch_size,
            found.expected_peak_bytes or None,
            profiles,
            found.fit.max_relative_error,
            None,
        )
    [only] = profiles
    measured_at = only.profile.world_size
    if measured_at > world_size:
        raise NotFoundError(
            f"this workload was measured under {mode} at world size {measured_at} only; a rank "
            f"at world size {world_size} may hold more: profile it at world size {world_size}, "
            "or at a second world size to estimate from"
        )
    probe = only.profile.probe_at(only.profile.max_micro_batch_size)
    return _Estimate(
        only.profile.max_micro_batch_size,
        probe.footprint_bytes if probe is not None else None,
        [only],
        None,
        f"measured at world size {measured_at} only: a rank's memory does not grow with the "
        f"world size, so its largest micro batch is kept; profile at world size "
        f"{world_size} (or a second world size) for a larger one",
    )
