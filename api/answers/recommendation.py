"""The answers the service gives: what a recommendation is, decided in one place.

The recommendation route, the embedded store of the Python client and the dashboard all
ask here; the store (:mod:`api.store.recommendation`) only reads the rows. This module
decides everything an answer says:

- measured (the newest profile of the pair at the run's world size and mesh shape,
  ``world_size / tp × tp``) or estimated (the workload's newest fit on another device; the
  fit across the world sizes and mesh shapes measured here; the fit across a length
  family's measured lengths);
- which caveat comes with an estimate (one world size only, one process only);
- every refusal and its one-line advice (the ``tuner profile`` command to run).

The plan's arithmetic (``M*`` below an OOM, the split of a global batch) is
:mod:`tuner.core.plan`'s; the fits are :mod:`tuner.core.worlds` and
:mod:`tuner.core.lengths`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Dialect
from sqlalchemy.orm import Session

from api.schemas.recommendation import RecommendationPublic, RecommendationQuery
from api.store.names import choose_device, choose_workload
from api.store.recommendation import (
    DeviceRow,
    RecommendationRows,
    StoredProfile,
    WorkloadRow,
)
from tuner.core import lengths as lengths_fit
from tuner.core import plan, results, worlds
from tuner.core.errors import BadInputError, NotFoundError, NothingFitsError
from tuner.core.parallel import PARALLEL_MODES, ParallelMode
from tuner.core.shape import MeshShape


def profile_command(device: DeviceRow, workload: WorkloadRow, *flags: str) -> str:
    """The ``tuner profile`` command that measures ``workload`` on ``device``, as a person
    runs it: a CPU device is its memory limit, which the command needs."""
    where = (
        ["--device", "cpu", "--memory-limit", str(device.capacity_bytes)]
        if device.kind == "cpu"
        else []
    )
    return " ".join(["tuner profile", workload.target or "TARGET", *where, *flags, "--upload"])


@dataclass(frozen=True)
class Source:
    """The profile a recommendation rests on."""

    profile_id: int
    device_key: str
    created_at: datetime
    headroom: float
    world_size: int = 1
    parallel: ParallelMode = "none"
    tp: int = 1


def recommend(
    session: Session, query: RecommendationQuery, *, now: datetime
) -> RecommendationPublic:
    """Measured from the newest profile of the pair, else estimated from another device,
    read in the session's transaction."""
    return answer(RecommendationRows.in_session(session), query, now=now)


def recommend_on(
    connection: Any, dialect: Dialect, query: RecommendationQuery, *, now: datetime
) -> RecommendationPublic:
    """:func:`recommend` on a DBAPI connection of ``dialect``, in its current transaction."""
    return answer(RecommendationRows(connection, dialect), query, now=now)


def answer(
    rows: RecommendationRows, query: RecommendationQuery, *, now: datetime
) -> RecommendationPublic:
    """The answer to ``query`` from the store's ``rows``.

    The run's parallel mode is the query's, else the workload's own. One process: the
    newest profile of the pair, else an estimate from another device. DDP or FSDP: the
    newest profile at the run's world size, else the fit across the world sizes measured
    (``estimated``), else the one-process profile with a caveat that says what it misses.
    """
    found = rows.workloads(query.workload)
    if not found and query.seq_len is not None:  # named by its length family's key
        found = sorted(rows.family(query.workload), key=lambda row: row.seq_len or 0)[-1:]
    workload = choose_workload(
        found, query.workload, rows.newest_profile, mode=query.parallel, seq_len=query.seq_len
    )
    device = choose_device(rows.devices(query.device), query.device)
    mode = query.parallel or _mode(workload.parallel_mode)
    answering = _Answering(rows, query, workload, device, mode, now)
    if query.seq_len is not None:
        return answering.by_length(query.seq_len)
    return answering.for_workload()


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

    rows: RecommendationRows
    query: RecommendationQuery
    workload: WorkloadRow
    device: DeviceRow
    mode: ParallelMode
    now: datetime

    def for_workload(self) -> RecommendationPublic:
        """The answer from the workload's own profiles, by the run's parallel mode."""
        w, mode = self.workload, self.mode
        if self.query.tp > 1 and mode != "fsdp":
            raise BadInputError(
                f"tp={self.query.tp} asks for a tensor-parallel mesh, which runs under fsdp, "
                f"not {mode}: ask with parallel=fsdp (the workload profiled on a mesh), or tp=1"
            )
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
            sibling = self.sibling() if self.query.tp == 1 else None
            if sibling is None:
                raise NotFoundError(
                    f"workload {w.name!r} ({w.key}) has no {mode} profile on device "
                    f"{self.device.name!r} ({self.device.key}){self._mesh_words()}, and no "
                    "one-process profile to warn from: profile it "
                    f"(`{profile_command(self.device, w, *self.ranks_flags())}`) or queue a job "
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

    def one_process(self, workload: WorkloadRow) -> RecommendationPublic:
        """Measured from the newest one-process profile of the pair, else estimated from
        the workload's newest fit on another device."""
        query, device = self.query, self.device
        found = self._measured(workload, world_size=1, parallel="none")
        if found is not None:
            return found
        fitted = self.rows.newest_fit(workload.id)
        if fitted is None:
            raise NotFoundError(
                f"workload {workload.name!r} ({workload.key}) has no profile on device "
                f"{device.name!r} ({device.key}), and none on another device to estimate "
                "from: profile it on this device "
                f"(`{profile_command(device, workload)}`) or queue a job for it"
            )
        limit = self.rows.oom_ever(workload.id, device.id)
        chosen = plan.recommend_estimated(
            fitted.fit,
            capacity_bytes=device.capacity_bytes,
            headroom=fitted.headroom,
            size_cap=fitted.size_cap,
            global_batch_size=query.global_batch_size,
            mesh=MeshShape(query.world_size, query.tp),
            policy=query.policy,
            oom_limit=self._below(limit),
        )
        source = Source(fitted.profile_id, fitted.device_key, fitted.created_at, fitted.headroom)
        return self._public(chosen, workload, source, limit)

    def across_world_sizes(self) -> RecommendationPublic | None:
        """Measured at the run's world size and mesh shape, else estimated from the fit
        across the world sizes and mesh shapes measured on this device (refused where it
        would extrapolate); ``None`` when none was."""
        query, workload, device = self.query, self.workload, self.device
        found = self._measured(
            workload, world_size=query.world_size, parallel=self.mode, tp=query.tp
        )
        if found is not None:
            return found
        profiles = self.rows.world_profiles(workload, device)
        if not profiles:
            return None
        limit = self.rows.oom_ever(workload.id, device.id)
        estimate = _estimate(profiles, query.world_size, query.tp, self.mode)
        if estimate.max_micro_batch_size < 1:
            where = _where(query.world_size, query.tp)
            raise NothingFitsError(
                f"estimated from {estimate.world_sizes}, not even a micro batch "
                f"of 1 fits at {where}: profile at {where} to measure it"
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
            newest.profile.parallel.tp,
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
                f"{profile_command(self.device, workload, '--seq-lens', '512,1024,2048')}`) to "
                "ask for other lengths"
            )
        members = {
            member.seq_len: member
            for member in self.rows.family(workload.length_family)
            if member.seq_len is not None
        }
        if seq_len in members:
            at_length = replace(self, workload=members[seq_len])
            return at_length._with_length(at_length.for_workload(), "measured", [seq_len])
        return self._with_length(*self._across_lengths(seq_len, members))

    def _across_lengths(
        self, seq_len: int, members: dict[int, WorkloadRow]
    ) -> tuple[RecommendationPublic, plan.Basis, list[int]]:
        """Estimated from the newest profile of each measured length on this device, at
        the run's world size."""
        world_size = 1 if self.mode == "none" else self.query.world_size
        tp = self.query.tp
        measured: dict[int, StoredProfile] = {}
        for length, member in sorted(members.items()):
            for newest in self.rows.world_profiles(member, self.device):
                if (newest.profile.world_size, newest.profile.parallel.tp) == (world_size, tp):
                    measured[length] = newest
        if len(measured) < 2:
            have = ", ".join(map(str, measured)) or "none"
            suggested = _suggested_lengths(seq_len, list(measured))
            raise NotFoundError(
                f"seq_len {seq_len} was not profiled on device {self.device.name!r} "
                f"({self.device.key}) at world size {world_size}, and an estimate needs two "
                f"or more measured lengths there (measured: {have}): profile it "
                f"(`{profile_command(self.device, self.workload, '--seq-lens', suggested)}`)"
            )
        lengths = list(measured)
        based_on = list(measured.values())
        estimate = at_length([s.profile for s in based_on], lengths, seq_len)
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
            tp,
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
            mesh=MeshShape(query.world_size, query.tp),
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
        self, workload: WorkloadRow, *, world_size: int, parallel: ParallelMode, tp: int = 1
    ) -> RecommendationPublic | None:
        """From the newest profile of the pair measured at ``world_size`` ranks as
        ``world_size / tp × tp``, if any."""
        measured = self.rows.newest_measured(workload.id, self.device.id, world_size, tp)
        if measured is None:
            return None
        profile_id, created_at, max_micro_batch_size, headroom, limit, probes = measured
        chosen = plan.recommend_measured(
            max_micro_batch_size=max_micro_batch_size,
            probes=probes,
            capacity_bytes=self.device.capacity_bytes,
            global_batch_size=self.query.global_batch_size,
            mesh=MeshShape(self.query.world_size, self.query.tp),
            policy=self.query.policy,
            oom_limit=self._below(limit),
        )
        source = Source(profile_id, self.device.key, created_at, headroom, world_size, parallel, tp)
        return self._public(chosen, workload, source, limit)

    def sibling(self) -> WorkloadRow | None:
        """The one-process workload this DDP or FSDP workload was built from, if stored."""
        return self.rows.one_process_sibling(self.workload)

    def ranks_flags(self) -> tuple[str, ...]:
        """The flags that profile the run's ranks as it trains."""
        mesh = ("--tp", str(self.query.tp)) if self.query.tp > 1 else ()
        return ("--world-size", str(self.query.world_size), "--parallel", self.mode, *mesh)

    def _mesh_words(self) -> str:
        """`` on a 2 × 2 mesh (dp × tp)`` when the run has one."""
        query = self.query
        return f" on a {_where(query.world_size, query.tp)}" if query.tp > 1 else ""

    def with_caveat(self, answer: RecommendationPublic) -> RecommendationPublic:
        """A one-process answer for a DDP or FSDP run: ``estimated``, and saying why."""
        ranks = f"{self.query.world_size} rank{'s' if self.query.world_size != 1 else ''}"
        caveat = (
            f"this workload was only measured in one process, not under {self.mode} on "
            f"{ranks}: {_MISSES[self.mode]}; profile it as it trains "
            f"(`{profile_command(self.device, self.workload, *self.ranks_flags())}`)"
        )
        return answer.model_copy(
            update={"basis": "estimated", "one_process_only": True, "caveat": caveat}
        )

    def _public(
        self,
        chosen: plan.Recommendation,
        workload: WorkloadRow,
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
            profile_tp=source.tp,
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


class _Estimate(NamedTuple):
    max_micro_batch_size: int
    expected_peak_bytes: int | None
    based_on: list[StoredProfile]
    expected_error: float | None
    caveat: str | None

    @property
    def world_sizes(self) -> str:
        """``world sizes 2, 4``, or ``mesh shapes 4 × 1, 2 × 2`` where one has a mesh."""
        shapes = [worlds.shape_of(stored.profile) for stored in self.based_on]
        if all(tp == 1 for _, tp in shapes):
            return "world sizes " + ", ".join(str(dp) for dp, _ in shapes)
        return "mesh shapes " + ", ".join(f"{dp} × {tp}" for dp, tp in shapes)


def _where(world_size: int, tp: int) -> str:
    """``world size 4``, or ``2 × 2 mesh (dp × tp)``."""
    return f"world size {world_size}" if tp == 1 else f"{world_size // tp} × {tp} mesh (dp × tp)"


def _estimate(profiles: list[StoredProfile], world_size: int, tp: int, mode: str) -> _Estimate:
    """From the fit across two or more world sizes or mesh shapes; from one shape no larger
    in dp and in tp, its own M* (a rank's memory does not grow with either, so it still
    fits)."""
    if len(profiles) >= 2:
        found = at_world_size([stored.profile for stored in profiles], world_size, tp)
        return _Estimate(
            found.max_micro_batch_size,
            found.expected_peak_bytes or None,
            profiles,
            found.fit.max_relative_error,
            None,
        )
    [only] = profiles
    measured_at = only.profile.world_size
    dp_measured, tp_measured = worlds.shape_of(only.profile)
    if tp_measured == 1 and tp == 1:
        if measured_at > world_size:
            raise NotFoundError(
                f"this workload was measured under {mode} at world size {measured_at} only; a "
                f"rank at world size {world_size} may hold more: profile it at world size "
                f"{world_size}, or at a second world size to estimate from"
            )
        there, here, what = f"world size {measured_at}", f"world size {world_size}", "size"
    else:
        there, here = _where(measured_at, tp_measured), _where(world_size, tp)
        if dp_measured > world_size // tp or tp_measured > tp:
            raise NotFoundError(
                f"this workload was measured under {mode} on a {there} only; a rank of a "
                f"{here} may hold more: profile it there (--world-size {world_size} --tp {tp}), "
                "or at more mesh shapes to estimate from"
            )
        what = "shape"
    probe = only.profile.probe_at(only.profile.max_micro_batch_size)
    return _Estimate(
        only.profile.max_micro_batch_size,
        probe.footprint_bytes if probe is not None else None,
        [only],
        None,
        f"measured at {there} only: a rank's memory does not grow with the world {what}, "
        f"so its largest micro batch is kept; profile at {here} (or a second {what}) for a "
        "larger one",
    )


# The estimates the dashboard draws beside the answers: the same functions, so a page and
# an answer cannot disagree about what a device, a world size or a length would hold.


class DeviceEstimate(NamedTuple):
    """``M*`` on a device never profiled, and the fit's footprint there."""

    max_micro_batch_size: int
    footprint_bytes: int | None


def on_device(
    fit: results.AffineFit, *, capacity_bytes: int, headroom: float, size_cap: int | None
) -> DeviceEstimate:
    """What a device with no profile of its own holds by another device's fit, as a
    one-process answer estimates it (before the OOM reports and the global batch); a fit
    that cannot estimate is a ``BadInputError`` saying why."""
    found = plan.estimate_max_micro_batch(fit, capacity_bytes, headroom, size_cap=size_cap)
    return DeviceEstimate(found, round(fit.predict(found)) if found > 0 else None)


def at_world_size(
    profiles: list[results.Profile], world_size: int, tp: int = 1
) -> worlds.WorldEstimate:
    """``M*`` at ``world_size`` ranks (as ``world_size / tp × tp``) from the fit across two
    or more measured world sizes or mesh shapes."""
    return worlds.estimate_world_size(profiles, world_size, tp)


def at_length(
    profiles: list[results.Profile], seq_lens: list[int], seq_len: int
) -> lengths_fit.LengthEstimate:
    """``M*`` at ``seq_len`` from the fit across two or more measured lengths."""
    return lengths_fit.estimate_length(profiles, seq_lens, seq_len)
