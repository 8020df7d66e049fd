"""The answer to a question, decided once, from the evidence a store hands over.

Every surface asks :func:`decide`: the REST route, the embedded store, ``tuner recommend``,
``tuner profile --global-batch-size``, the client's offline plan, ``plan_training`` and the
dashboard's calculator. What it decides:

- which rows the question means (:mod:`tuner.answer.identity`);
- the run's parallel mode: the question's, else the workload's own;
- measured: the current profile of the pair at the run's mesh shape
  (:mod:`tuner.answer.current`), capped by the OOM reports made since it was received;
- else estimated: from the workload's newest fit on another device (one process); from the
  fit across the mesh shapes measured on this device (DDP, FSDP), refused where it would
  extrapolate; from the fit across a length family's measured lengths;
- else the one-process profile with a caveat (a DDP or FSDP run measured only in one
  process), or refused with the ``tuner profile`` command that would measure it.

The arithmetic of a plan is :mod:`tuner.core.plan`; the fits are :mod:`tuner.core.worlds`
and :mod:`tuner.core.lengths`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from tuner.answer import current, identity
from tuner.answer.evidence import (
    DeviceRow,
    Evidence,
    OomRow,
    ProfileRow,
    WorkloadRow,
    workload_info,
)
from tuner.core import lengths as lengths_fit
from tuner.core import plan, results, worlds
from tuner.core.errors import BadInputError, NotFoundError, NothingFitsError
from tuner.core.parallel import PARALLEL_MODES, ParallelMode
from tuner.core.shape import ONE_PROCESS, MeshShape
from tuner.core.wire.recommendation import RecommendationPublic, RecommendationQuery

# What a one-process profile misses of a parallel run, said to whoever asks for one.
_MISSES = {
    "ddp": "a DDP rank also holds the all-reduce buckets (a second copy of the gradients "
    "unless gradient_as_bucket_view zeroes them in place), so the micro batch may run out "
    "of memory",
    "fsdp": "an FSDP rank holds shards of parameters, gradients and optimizer state but "
    "all-gathers whole layers (and, syncing on the last micro batch, keeps unsharded "
    "gradients), so its largest micro batch can be larger or smaller",
}


def profile_command(device: DeviceRow, workload: WorkloadRow, *flags: str) -> str:
    """The ``tuner profile`` command that measures ``workload`` on ``device``, as a person
    runs it: a CPU device is its memory limit, which the command needs."""
    where = (
        ["--device", "cpu", "--memory-limit", str(device.capacity_bytes)]
        if device.kind == "cpu"
        else []
    )
    return " ".join(["tuner profile", workload.target or "TARGET", *where, *flags, "--upload"])


def decide(
    question: RecommendationQuery, evidence: Evidence, *, now: datetime
) -> RecommendationPublic:
    """The answer to ``question`` from ``evidence``, or the error that refuses it."""
    meant = Meaning.of(question, evidence)
    answering = _Answering(question, evidence, meant, now)
    if question.seq_len is not None:
        return answering.by_length(question.seq_len)
    return answering.for_workload()


@dataclass(frozen=True)
class Meaning:
    """What a question's references mean: its workload, device and parallel mode."""

    workload: WorkloadRow
    device: DeviceRow
    mode: ParallelMode

    @classmethod
    def of(cls, question: RecommendationQuery, evidence: Evidence) -> Meaning:
        reference = question.workload
        found = list(evidence.workloads(reference))
        if not identity.owned(found, reference) and question.seq_len is not None:
            # Named by its length family's key: the family's longest member stands for it.
            members = identity.family_members(evidence.family(reference))
            found = sorted(members, key=lambda row: row.seq_len or 0)[-1:]
            reference = found[0].key if found else reference
        candidates = identity.owned(found, reference)
        profiles = evidence.profiles([row.id for row in candidates]) if len(candidates) > 1 else ()
        workload = identity.choose_workload(
            found,
            reference,
            newest_of=lambda row: current.newest(p for p in profiles if p.workload_id == row.id),
            speed_of=lambda profile: _speed_at_max(evidence, profile),
            mode=question.parallel,
            seq_len=question.seq_len,
        )
        device = identity.choose_device(evidence.devices(question.device), question.device)
        mode = question.parallel or _mode(workload.parallel_mode)
        return cls(workload, device, mode)


def _speed_at_max(evidence: Evidence, profile: ProfileRow) -> float:
    probes = current.timed(profile, evidence.probes([profile.id]).get(profile.id, ()))
    return current.speed_at_max(profile, probes)


def _mode(stored: str) -> ParallelMode:
    if stored not in PARALLEL_MODES:
        raise ValueError(f"stored parallel mode {stored!r} is not one of {PARALLEL_MODES}")
    return stored  # type: ignore[return-value]


@dataclass(frozen=True)
class _Source:
    """The profile an answer rests on."""

    profile_id: int
    device_key: str
    created_at: datetime
    headroom: float
    mesh: MeshShape = ONE_PROCESS
    parallel: ParallelMode = "none"
    simulated_ranks: bool = False


@dataclass(frozen=True)
class _Answering:
    """One question, once its rows are known."""

    question: RecommendationQuery
    evidence: Evidence
    meant: Meaning
    now: datetime

    @property
    def workload(self) -> WorkloadRow:
        return self.meant.workload

    @property
    def device(self) -> DeviceRow:
        return self.meant.device

    @property
    def mode(self) -> ParallelMode:
        return self.meant.mode

    @property
    def mesh(self) -> MeshShape:
        return self.question.mesh

    def for_workload(self) -> RecommendationPublic:
        """The answer from the workload's own profiles, by the run's parallel mode."""
        w, mode = self.workload, self.mode
        if self.mesh.is_mesh and mode != "fsdp":
            raise BadInputError(
                f"tp={self.mesh.tp} asks for a tensor-parallel mesh, which runs under fsdp, "
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
            found = self.across_shapes()
            if found is not None:
                return found
            sibling = self.sibling() if not self.mesh.is_mesh else None
            if sibling is None:
                mesh_words = f" on a {self.mesh.where()}" if self.mesh.is_mesh else ""
                raise NotFoundError(
                    f"workload {w.name!r} ({w.key}) has no {mode} profile on device "
                    f"{self.device.name!r} ({self.device.key}){mesh_words}, and no "
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

    def _reports(self, workload: WorkloadRow) -> Sequence[OomRow]:
        return self.evidence.oom_reports([workload.id])

    def _on_device(self, workload: WorkloadRow) -> Sequence[ProfileRow]:
        """The workload's profiles on the question's device."""
        return self.evidence.profiles([workload.id], device_id=self.device.id)

    def one_process(self, workload: WorkloadRow) -> RecommendationPublic:
        """Measured from the current one-process profile of the pair, else estimated from
        the workload's newest fit on another device."""
        device = self.device
        found = self._measured(workload, self._on_device(workload), ONE_PROCESS, "none")
        if found is not None:
            return found
        fitted = current.newest(
            p
            for p in self.evidence.profiles([workload.id])
            if p.workload_id == workload.id and p.fit is not None and p.fit.bytes_per_sample > 0
        )
        if fitted is None or fitted.fit is None:
            raise NotFoundError(
                f"workload {workload.name!r} ({workload.key}) has no profile on device "
                f"{device.name!r} ({device.key}), and none on another device to estimate "
                "from: profile it on this device "
                f"(`{profile_command(device, workload)}`) or queue a job for it"
            )
        limit = current.oom_cap(self._reports(workload), workload.id, device.id, since=None)
        chosen = plan.recommend_estimated(
            fitted.fit,
            capacity_bytes=device.capacity_bytes,
            headroom=fitted.headroom,
            size_cap=fitted.size_cap,
            global_batch_size=self.question.global_batch_size,
            mesh=self.mesh,
            policy=self.question.policy,
            oom_limit=self._below(limit),
        )
        source = _Source(fitted.id, fitted.device_key, fitted.created_at, fitted.headroom)
        return self._public(chosen, workload, source, limit)

    def across_shapes(self) -> RecommendationPublic | None:
        """Measured at the run's mesh shape, else estimated from the fit across the shapes
        measured on this device (refused where it would extrapolate); ``None`` when none
        was."""
        workload, device = self.workload, self.device
        on_device = self._on_device(workload)
        found = self._measured(workload, on_device, self.mesh, self.mode)
        if found is not None:
            return found
        shapes = current.current_per_shape(on_device, workload.id, device.id)
        if not shapes:
            return None
        limit = current.oom_cap(self._reports(workload), workload.id, device.id, since=None)
        estimate = self._estimate(shapes)
        chosen = self._estimated_plan(estimate.size, estimate.peak, limit)
        newest = current.newest(estimate.based_on)
        assert newest is not None  # an estimate rests on one profile or more
        source = _Source(
            newest.id, device.key, newest.created_at, newest.headroom, newest.mesh, self.mode
        )
        return self._public(
            chosen,
            workload,
            source,
            limit,
            based_on=[row.id for row in estimate.based_on],
            expected_error=estimate.error,
            caveat=estimate.caveat,
        )

    def _estimate(self, shapes: list[ProfileRow]) -> _Estimate:
        """From the fit across two or more shapes; from one shape that bounds the run's
        (no larger in dp and in tp), its own M*: a rank's memory does not grow with either,
        so it still fits."""
        asked = self.mesh
        if len(shapes) >= 2:
            profiles = self._as_profiles(shapes)
            found = worlds.estimate_world_size(profiles, asked)
            if found.max_micro_batch_size < 1:
                meshes = [row.mesh for row in shapes]
                words = (
                    "world sizes " + ", ".join(str(m.world_size) for m in meshes)
                    if not any(m.is_mesh for m in meshes)
                    else "mesh shapes " + ", ".join(str(m) for m in meshes)
                )
                raise NothingFitsError(
                    f"estimated from {words}, not even a micro batch of 1 fits at "
                    f"{asked.where()}: profile at {asked.where()} to measure it"
                )
            return _Estimate(
                found.max_micro_batch_size,
                found.expected_peak_bytes or None,
                shapes,
                found.fit.max_relative_error,
                None,
            )
        [only] = shapes
        measured = only.mesh
        what = "shape" if measured.is_mesh or asked.is_mesh else "size"
        if not measured.bounds(asked):
            if what == "size":
                raise NotFoundError(
                    f"this workload was measured under {self.mode} at world size "
                    f"{measured.world_size} only; a rank at world size {asked.world_size} may "
                    f"hold more: profile it at world size {asked.world_size}, or at a second "
                    "world size to estimate from"
                )
            raise NotFoundError(
                f"this workload was measured under {self.mode} on a {measured.where()} only; "
                f"a rank of a {asked.where()} may hold more: profile it there "
                f"({' '.join(asked.flags())}), or at more mesh shapes to estimate from"
            )
        probes = self.evidence.probes([only.id]).get(only.id, ())
        at_max = current.probe_at(probes, only.max_micro_batch_size)
        there = measured.where()
        return _Estimate(
            only.max_micro_batch_size,
            current.footprint(at_max),
            [only],
            None,
            f"measured at {there} only: a rank's memory does not grow with the world {what}, "
            f"so its largest micro batch is kept; profile at {asked.where()} (or a second "
            f"{what}) for a larger one",
        )

    def _as_profiles(self, rows: Sequence[ProfileRow]) -> list[results.Profile]:
        """Stored profiles as the fits read them."""
        probes = self.evidence.probes([row.id for row in rows])
        workload, device = self.workload, self.device
        return [
            results.Profile(
                workload_key=workload.key,
                device_key=device.key,
                workload=workload_info(workload),
                device=results.DeviceInfo(
                    kind=device.kind, name=device.name, capacity_bytes=device.capacity_bytes
                ),
                created_at=row.created_at,
                world_size=row.world_size,
                parallel=row.parallel,
                max_micro_batch_size=row.max_micro_batch_size,
                headroom=row.headroom,
                budget_bytes=row.budget_bytes,
                strategy=row.strategy,
                size_cap=row.size_cap,
                probes=list(probes.get(row.id, ())),
                fit=row.fit,
                settings=results.ProbeSettings(),
                wall_time_s=0.0,
            )
            for row in rows
        ]

    def _below(self, limit: int | None) -> int | None:
        """The size the plan stays below: the OOM limit, and for packed sequences one past
        the sequences a micro batch's tokens hold (the plan then never exceeds them)."""
        question = self.question
        if question.tokens_per_micro_batch is None or question.seq_len is None:
            return limit
        above_budget = question.tokens_per_micro_batch // question.seq_len + 1
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
            for member in identity.family_members(self.evidence.family(workload.length_family))
            if member.seq_len is not None
        }
        if seq_len in members:
            member = members[seq_len]
            at_length = replace(self, meant=replace(self.meant, workload=member))
            return at_length._with_length(at_length.for_workload(), "measured", [seq_len])
        return self._across_lengths(seq_len, members)

    def _across_lengths(
        self, seq_len: int, members: dict[int, WorkloadRow]
    ) -> RecommendationPublic:
        """Estimated from the current profile of each measured length on this device, at
        the run's mesh shape."""
        mesh = ONE_PROCESS if self.mode == "none" else self.mesh
        profiles = self.evidence.profiles(
            [member.id for member in members.values()], device_id=self.device.id
        )
        measured: dict[int, ProfileRow] = {}
        for length, member in sorted(members.items()):
            found = current.current_at(profiles, member.id, self.device.id, mesh)
            if found is not None:
                measured[length] = found
        if len(measured) < 2:
            have = ", ".join(map(str, measured)) or "none"
            suggested = _suggested_lengths(seq_len, list(measured))
            raise NotFoundError(
                f"seq_len {seq_len} was not profiled on device {self.device.name!r} "
                f"({self.device.key}) at world size {mesh.world_size}, and an estimate needs "
                f"two or more measured lengths there (measured: {have}): profile it "
                f"(`{profile_command(self.device, self.workload, '--seq-lens', suggested)}`)"
            )
        lengths = list(measured)
        based_on = list(measured.values())
        estimate = lengths_fit.estimate_length(self._as_profiles(based_on), lengths, seq_len)
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
        source = _Source(
            longest.id, self.device.key, longest.created_at, longest.headroom, mesh, self.mode
        )
        answer = self._public(
            chosen,
            self.workload,
            source,
            None,
            based_on=[row.id for row in based_on],
            expected_error=estimate.fit.max_relative_error if estimate.fit else None,
        )
        return self._with_length(answer, "estimated", lengths)

    def _with_length(
        self, answer: RecommendationPublic, basis: plan.Basis, lengths: list[int]
    ) -> RecommendationPublic:
        """``answer`` for sequences of the asked length, in tokens too; refused when a packed
        micro batch's tokens do not fit."""
        question = self.question
        seq_len = question.seq_len or 0
        tokens = question.tokens_per_micro_batch
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
        chosen = plan.recommend_measured(
            max_micro_batch_size=max_micro_batch_size,
            probes=(),
            capacity_bytes=self.device.capacity_bytes,
            global_batch_size=self.question.global_batch_size,
            mesh=self.mesh,
            policy=self.question.policy,
            oom_limit=self._below(limit),
        )
        # The estimate's peak is for its own size M*; a smaller choice (an OOM limit, the
        # batch) peaks no higher, so that figure bounds it, as a measured plan's does.
        return chosen.model_copy(
            update={
                "basis": "estimated",
                "expected_peak_bytes": peak_bytes,
                "expected_headroom_bytes": (
                    self.device.capacity_bytes - peak_bytes if peak_bytes else None
                ),
            }
        )

    def _measured(
        self,
        workload: WorkloadRow,
        profiles: Sequence[ProfileRow],
        mesh: MeshShape,
        parallel: ParallelMode,
    ) -> RecommendationPublic | None:
        """From the pair's current profile at ``mesh``, if any, capped by the OOM reports
        made since it was received."""
        found = current.current_at(profiles, workload.id, self.device.id, mesh)
        if found is None:
            return None
        limit = current.profile_cap(found, self._reports(workload))
        probes = current.timed(found, self.evidence.probes([found.id]).get(found.id, ()))
        chosen = plan.recommend_measured(
            max_micro_batch_size=found.max_micro_batch_size,
            probes=probes,
            capacity_bytes=self.device.capacity_bytes,
            global_batch_size=self.question.global_batch_size,
            mesh=self.mesh,
            policy=self.question.policy,
            oom_limit=self._below(limit),
            speeds=current.speed_curve(found, self.evidence.speeds(found.id)),
        )
        source = _Source(
            found.id,
            self.device.key,
            found.created_at,
            found.headroom,
            mesh,
            parallel,
            simulated_ranks=found.simulated_ranks,
        )
        return self._public(chosen, workload, source, limit)

    def sibling(self) -> WorkloadRow | None:
        """The one-process workload this DDP or FSDP workload was built from, if stored:
        the same name, model and registrant (the mode is part of the key, so the keys
        differ; and no one else's workload of that name can stand in for it)."""
        w = self.workload
        same = [
            row
            for row in self.evidence.workloads(w.name)
            if row.name == w.name
            and row.parallel_mode == "none"
            and (row.parameter_count, row.precision, row.optimizer, row.registered_by)
            == (w.parameter_count, w.precision, w.optimizer, w.registered_by)
            and row.activation_checkpointing == w.activation_checkpointing
        ]
        return max(same, key=lambda row: row.id, default=None)

    def ranks_flags(self) -> tuple[str, ...]:
        """The flags that profile the run's ranks as it trains."""
        mesh = self.mesh
        tp = ("--tp", str(mesh.tp)) if mesh.is_mesh else ()
        return ("--world-size", str(mesh.world_size), "--parallel", self.mode, *tp)

    def with_caveat(self, answer: RecommendationPublic) -> RecommendationPublic:
        """A one-process answer for a DDP or FSDP run: ``estimated``, and saying why."""
        size = self.mesh.world_size
        ranks = f"{size} rank{'s' if size != 1 else ''}"
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
        source: _Source,
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
            profile_world_size=source.mesh.world_size,
            profile_tp=source.mesh.tp,
            profile_parallel=source.parallel,
            profile_created_at=source.created_at,
            profile_simulated_ranks=source.simulated_ranks,
            profile_age_s=max(0.0, (self.now - source.created_at).total_seconds()),
            based_on_profiles=based_on or [source.profile_id],
            expected_error=expected_error,
            caveat=caveat,
        )


@dataclass(frozen=True)
class _Estimate:
    size: int
    peak: int | None
    based_on: list[ProfileRow]
    error: float | None
    caveat: str | None


def _suggested_lengths(seq_len: int, measured: list[int]) -> str:
    """Lengths to profile so that ``seq_len`` is measured and a fit has three points."""
    lengths = sorted({seq_len, *measured})
    for factor in (2, 4):
        if len(lengths) >= 3:
            break
        lengths = sorted({*lengths, seq_len // factor or 1})
    return ",".join(map(str, lengths))
