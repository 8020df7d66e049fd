"""Read-only queries behind the dashboard's pages.

Each page costs a fixed handful of statements whatever it shows: the profile list is one
statement for its rows (M*, the footprint and speed at M*, whether a newer profile of the
pair exists and the smallest OOM reported since are correlated subqueries, each one
index lookup), one count and two for the filter menus. Nothing loads lazily per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import ColumnElement, and_, exists, func, or_, select
from sqlalchemy.orm import Session, aliased

from api import models
from api.dashboard.format import fmt_bytes, fmt_int, mesh_label, mode_label, oom_cap, variant_text
from api.store.evidence import SqlEvidence, device_row
from api.store.profiles import find_device, find_workload, get_profile, get_workload, to_public
from api.store.projects import in_project
from tuner.answer import current
from tuner.answer.devices import DeviceResult, on_every_device
from tuner.core.errors import NotFoundError
from tuner.core.results import ProbeResult
from tuner.core.shape import ONE_PROCESS
from tuner.core.wire.profiles import ProfilePublic

SortKey = Literal["created", "mstar", "headroom", "workload", "device"]
SORT_KEYS: tuple[SortKey, ...] = ("created", "mstar", "headroom", "workload", "device")
PAGE_SIZES = (25, 50, 100, 200)
DEFAULT_PAGE_SIZE = 50
# A download of the list holds at most this many rows, whatever the filters.
EXPORT_LIMIT = 1000
PROFILE_FIELDS = (
    "id",
    "workload_id",
    "workload_key",
    "workload_name",
    "device_id",
    "device_key",
    "device_name",
    "created_at",
    "max_micro_batch_size",
    "headroom",
    "budget_bytes",
    "size_cap",
    "world_size",
    "parallel_mode",
    "tp",
    "seq_len",
    "variant",
    "capacity_bytes",
    "footprint_bytes",
    "free_bytes",
    "samples_per_second",
    "status",
    "oom_limit",
)


# The profile list


def query_string(
    values: dict[str, Any], changes: dict[str, Any], defaults: dict[str, Any]
) -> dict[str, str]:
    """A list's query string: ``values`` with ``changes``, unset and default ones left out
    (so a shared URL names only what was chosen)."""
    merged = {**values, **changes}
    return {
        name: str(value)
        for name, value in merged.items()
        if value is not None and defaults.get(name) != value
    }


@dataclass(frozen=True)
class ListQuery:
    """What the profile list shows: filters by id, one sort key, one page."""

    workload_id: int | None = None
    device_id: int | None = None
    latest_only: bool = False
    sort: SortKey = "created"
    descending: bool = True
    page: int = 1
    size: int = DEFAULT_PAGE_SIZE

    @property
    def filtered(self) -> bool:
        return self.workload_id is not None or self.device_id is not None or self.latest_only

    def params(self, **changes: Any) -> dict[str, str]:
        """The query string of this view with ``changes``; defaults are left out."""
        values = {
            "workload": self.workload_id,
            "device": self.device_id,
            "latest": 1 if self.latest_only else None,
            "sort": self.sort,
            "order": "desc" if self.descending else "asc",
            "page": self.page,
            "size": self.size,
        }
        defaults = {"sort": "created", "order": "desc", "page": 1, "size": DEFAULT_PAGE_SIZE}
        return query_string(values, changes, defaults)


@dataclass(frozen=True)
class Status:
    code: str
    label: str
    tone: Literal["ok", "muted", "bad", "warn", "info"]
    hint: str


@dataclass(frozen=True)
class ProfileRow:
    id: int
    created_at: datetime
    workload_id: int
    workload_name: str
    workload_key: str
    device_id: int
    device_name: str
    device_key: str
    capacity_bytes: int
    max_micro_batch_size: int
    size_cap: int
    headroom: float
    budget_bytes: int
    footprint_bytes: int | None
    samples_per_second: float | None
    superseded: bool
    oom_limit: int | None
    world_size: int = 1
    parallel_mode: str = "none"
    variant: dict[str, Any] = field(default_factory=dict)
    seq_len: int | None = None
    tp: int = 1  # the mesh's tensor-parallel degree (world_size / tp × tp); 1 without one
    simulated_ranks: bool = False  # a fake world's: memory measured, speed not

    def record(self) -> dict[str, Any]:
        """The row for the list's downloads: the JSON API's names where it has the field
        (``GET /api/v1/profiles``), then what the page adds (footprint, speed, status)."""
        return {
            "id": self.id,
            "workload_id": self.workload_id,
            "workload_key": self.workload_key,
            "workload_name": self.workload_name,
            "device_id": self.device_id,
            "device_key": self.device_key,
            "device_name": self.device_name,
            "created_at": self.created_at.isoformat(),
            "max_micro_batch_size": self.max_micro_batch_size,
            "headroom": self.headroom,
            "budget_bytes": self.budget_bytes,
            "size_cap": self.size_cap,
            "world_size": self.world_size,
            "parallel_mode": self.parallel_mode,
            "tp": self.tp,
            "seq_len": self.seq_len,
            "variant": self.variant,
            "capacity_bytes": self.capacity_bytes,
            "footprint_bytes": self.footprint_bytes,
            "free_bytes": self.free_bytes,
            "samples_per_second": self.samples_per_second,
            "status": self.status.code,
            "oom_limit": self.oom_limit,
        }

    @property
    def free_bytes(self) -> int | None:
        """Device memory left at M*: capacity less the measured footprint."""
        if self.footprint_bytes is None:
            return None
        return self.capacity_bytes - self.footprint_bytes

    @property
    def free_fraction(self) -> float | None:
        free = self.free_bytes
        return None if free is None or self.capacity_bytes <= 0 else free / self.capacity_bytes

    @property
    def status(self) -> Status:
        return profile_status(
            max_micro_batch_size=self.max_micro_batch_size,
            size_cap=self.size_cap,
            superseded=self.superseded,
            oom_limit=self.oom_limit,
        )


def profile_status(
    *, max_micro_batch_size: int, size_cap: int, superseded: bool, oom_limit: int | None
) -> Status:
    """One word for a profile, most important first: whether recommendations use it, and
    whether its M* still holds."""
    if superseded:
        return Status(
            "superseded",
            "superseded",
            "muted",
            "a newer profile of this workload on this device, at this world size and mesh "
            "shape, is what recommendations use",
        )
    if max_micro_batch_size < 1:
        return Status(
            "nothing-fits",
            "nothing fits",
            "bad",
            "not even a micro batch of 1 fits this device's memory",
        )
    if oom_limit is not None and oom_limit <= max_micro_batch_size:
        return Status(
            "oom-reported",
            f"OOM: at most {oom_limit - 1}",
            "warn",
            f"{oom_cap(oom_limit)}, until a newer profile exists",
        )
    if max_micro_batch_size >= size_cap:
        return Status(
            "at-cap",
            "at --max",
            "info",
            f"every size up to the search's cap ({size_cap}) fits: the true M* may be larger",
        )
    return Status("current", "current", "ok", "the newest profile of this workload and device")


@dataclass(frozen=True)
class Choice:
    id: int
    label: str
    key: str = ""


@dataclass(frozen=True)
class ProfileList:
    rows: list[ProfileRow]
    count: int
    total: int
    workloads: list[Choice]
    devices: list[Choice]

    def pages(self, size: int) -> int:
        return max(1, -(-self.count // size))


_P = models.Profile
_W = models.Workload
_D = models.Device
_Probe = models.Probe


def _at_max(profile: Any) -> ColumnElement[bool]:
    """The fitting probes at the profile's M*."""
    return and_(
        _Probe.profile_id == profile.id,
        _Probe.micro_batch_size == profile.max_micro_batch_size,
        _Probe.fits.is_(True),
    )


def _superseded(profile: Any) -> Any:
    """SQL for "a newer profile of the pair exists at the profile's mesh shape", which the
    list filters and counts by in the database; it states :func:`tuner.answer.current.
    superseded` (received later, then stored later), and ``tests/dashboard`` holds the two
    to the same rows."""
    newer = aliased(models.Profile)
    return exists().where(
        newer.workload_id == profile.workload_id,
        newer.device_id == profile.device_id,
        newer.world_size == profile.world_size,
        newer.tp == profile.tp,
        or_(
            newer.received_at > profile.received_at,
            and_(newer.received_at == profile.received_at, newer.id > profile.id),
        ),
    )


@dataclass(frozen=True)
class _Decided:
    """What :mod:`tuner.answer.current` says of one listed profile."""

    superseded: bool
    oom_limit: int | None
    footprint_bytes: int | None
    samples_per_second: float | None


def _decided(
    session: Session, profile_ids: Sequence[int], workload_ids: Sequence[int], project_id: int
) -> dict[int, _Decided]:
    """Whether each listed profile is superseded, what caps it, and its footprint and
    speed at M*, decided by :mod:`tuner.answer.current` from the evidence of the page's
    workloads (the same definitions an answer uses)."""
    evidence = SqlEvidence(session, project_id)
    profiles = evidence.profiles(set(workload_ids))
    reports = evidence.oom_reports(set(workload_ids))
    probes = evidence.probes(profile_ids)
    decided: dict[int, _Decided] = {}
    for row in profiles:
        if row.id not in probes:
            continue
        fitting = [p for p in current.timed(row, probes[row.id]) if p.fits]
        at_max = current.probe_at(fitting, row.max_micro_batch_size)
        decided[row.id] = _Decided(
            superseded=current.superseded(row, profiles),
            oom_limit=current.profile_cap(row, reports),
            footprint_bytes=current.footprint(at_max),
            samples_per_second=at_max.samples_per_second if at_max is not None else None,
        )
    return decided


def list_profiles(session: Session, query: ListQuery, *, project_id: int) -> ProfileList:
    """One page of the project's profile rows, the number matching, and the filter menus."""
    # Sorting by headroom orders by the reserved peak and memory outside torch at M* (the
    # page shows the footprint tuner.answer.current defines, CPU collective copies in it).
    footprint = (
        select(_Probe.peak_reserved_bytes + _Probe.non_torch_bytes)
        .where(_at_max(_P))
        .order_by(_Probe.ordinal.desc())
        .limit(1)
        .scalar_subquery()
    )
    superseded = _superseded(_P)
    of_project = in_project(project_id)
    where: list[ColumnElement[bool]] = [of_project]
    if query.workload_id is not None:
        where.append(_P.workload_id == query.workload_id)
    if query.device_id is not None:
        where.append(_P.device_id == query.device_id)
    if query.latest_only:
        where.append(~superseded)
    free = _D.capacity_bytes - footprint
    column: Any = {
        "created": _P.created_at,
        "mstar": _P.max_micro_batch_size,
        "headroom": free,
        "workload": _W.name,
        "device": _D.name,
    }[query.sort]
    ordered = column.desc() if query.descending else column.asc()
    tie = _P.id.desc() if query.descending else _P.id.asc()
    statement = (
        select(
            _P.id,
            _P.created_at,
            _P.workload_id,
            _W.name,
            _W.key,
            _P.device_id,
            _D.name,
            _D.key,
            _D.capacity_bytes,
            _P.max_micro_batch_size,
            _P.size_cap,
            _P.headroom,
            _P.budget_bytes,
            _P.world_size,
            _P.parallel_mode,
            _P.variant,
            _W.seq_len,
            _P.tp,
            _P.settings["simulated_ranks"].as_boolean(),
        )
        .join(_W, _W.id == _P.workload_id)
        .join(_D, _D.id == _P.device_id)
        .where(*where)
        .order_by(ordered.nulls_last(), tie)
        .limit(query.size)
        .offset((query.page - 1) * query.size)
    )
    found = session.execute(statement).all()
    decided = _decided(session, [r[0] for r in found], [r[2] for r in found], project_id)
    rows = [
        ProfileRow(
            id=r[0],
            created_at=r[1],
            workload_id=r[2],
            workload_name=r[3],
            workload_key=r[4],
            device_id=r[5],
            device_name=r[6],
            device_key=r[7],
            capacity_bytes=r[8],
            max_micro_batch_size=r[9],
            size_cap=r[10],
            headroom=r[11],
            budget_bytes=r[12],
            footprint_bytes=decided[r[0]].footprint_bytes,
            samples_per_second=decided[r[0]].samples_per_second,
            superseded=decided[r[0]].superseded,
            oom_limit=decided[r[0]].oom_limit,
            world_size=r[13],
            parallel_mode=r[14],
            variant=dict(r[15] or {}),
            seq_len=r[16],
            tp=r[17] or 1,
            simulated_ranks=bool(r[18]),
        )
        for r in found
    ]
    count = session.scalar(select(func.count()).select_from(_P).where(*where)) or 0
    total = count
    if query.filtered:
        # Tells "nothing matches these filters" apart from "nothing stored yet".
        total = session.scalar(select(func.count()).select_from(_P).where(of_project)) or 0
    return ProfileList(
        rows=rows,
        count=count,
        total=total,
        workloads=workload_choices(session, project_id),
        devices=device_choices(session, project_id),
    )


def _labelled(rows: Sequence[tuple[int, str, str]]) -> list[Choice]:
    """Labels, with a short key only where two still read the same."""
    seen: dict[str, int] = {}
    for _id, label, _key in rows:
        seen[label] = seen.get(label, 0) + 1
    return [
        Choice(row_id, f"{label} ({key[:8]})" if seen[label] > 1 else label, key)
        for row_id, label, key in rows
    ]


def run_label(
    name: str,
    *,
    parallel_mode: str = "none",
    world_size: int | None = None,
    seq_len: int | None = None,
    variant: dict[str, Any] | None = None,
) -> str:
    """What tells runs of one model apart, in words: ``gpt · DDP × 2 · seq 128 ·
    checkpointing=true`` (the badges, as text for a menu)."""
    parts = [name]
    if world_size is not None:
        parts.append(mode_label(parallel_mode, world_size))
    elif parallel_mode != "none":
        parts.append(parallel_mode.upper())
    if seq_len is not None:
        parts.append(f"seq {seq_len}")
    if variant:
        parts.append(variant_text(variant))
    return " · ".join(parts)


def variants_by_workload(session: Session, project_id: int) -> dict[int, dict[str, Any]]:
    """The variant options each explored workload's profiles measured (one workload per
    variant: the options change the key)."""
    rows = session.execute(
        select(_P.workload_id, _P.variant)
        .where(in_project(project_id), _P.variant_group.is_not(None))
        .order_by(_P.received_at.asc())
    ).all()
    return {workload_id: dict(variant or {}) for workload_id, variant in rows}


def workload_choices(session: Session, project_id: int) -> list[Choice]:
    """Every workload of the project, named by what tells it apart: its mode, sequence
    length and the variant options its profiles measured (an explored variant is a
    workload of its own)."""
    rows = session.execute(
        select(_W.id, _W.name, _W.key, _W.parallel_mode, _W.seq_len)
        .where(_W.project_id == project_id)
        .order_by(_W.name, _W.id)
    ).all()
    variants = variants_by_workload(session, project_id)
    return _labelled(
        [
            (
                r[0],
                run_label(r[1], parallel_mode=r[3], seq_len=r[4], variant=variants.get(r[0])),
                r[2],
            )
            for r in rows
        ]
    )


def device_choices(session: Session, project_id: int) -> list[Choice]:
    """Every device of the project, named with its memory (what a reader picks a device by),
    smallest memory first: names sort as text, which put 128 MiB before 48."""
    rows = session.execute(
        select(_D.id, _D.name, _D.key, _D.capacity_bytes)
        .where(_D.project_id == project_id)
        .order_by(_D.capacity_bytes, _D.name, _D.id)
    ).all()
    return _labelled([(r[0], f"{r[1]} · {fmt_bytes(r[3])}", r[2]) for r in rows])


@dataclass(frozen=True)
class WorkloadGroup:
    """One model's workloads in the calculator's menu: an ``<optgroup>`` named by the
    model, one choice per workload labelled by its runs (``gpt · DDP · W = 2, 4 · seq
    128``)."""

    name: str
    choices: list[Choice]


_MODE_ORDER = {"none": 0, "ddp": 1, "fsdp": 2}


def _runs_text(mode: str, shapes: Sequence[tuple[int, int]]) -> str:
    """The runs measured, in words: ``one process``, ``DDP · W = 2, 4``, ``FSDP · W = 4
    (2 × 2 mesh)``; ``DDP · not profiled`` for a workload with no profile yet."""
    head = "one process" if mode == "none" else mode.upper()
    sizes = [
        f"{w} ({mesh_label(w, tp)})" if mesh_label(w, tp) else str(w) for w, tp in sorted(shapes)
    ]
    if not sizes:
        return f"{head} · not profiled"
    if mode == "none" and sizes == ["1"]:
        return head
    return f"{head} · W = {', '.join(sizes)}"


def workload_groups(session: Session, project_id: int) -> list[WorkloadGroup]:
    """The project's workloads grouped by model name, each labelled by what tells it apart
    from the others of its model: its mode and the world sizes and meshes it was measured
    at, its sequence length, the variant options an exploration measured; where two still
    read the same, the columns that differ (precision, optimizer, checkpointing,
    parameters), and the key only as a last resort. Two statements."""
    rows = session.execute(
        select(
            _W.id,
            _W.name,
            _W.key,
            _W.parallel_mode,
            _W.seq_len,
            _W.precision,
            _W.optimizer,
            _W.activation_checkpointing,
            _W.parameter_count,
        ).where(_W.project_id == project_id)
    ).all()
    shapes: dict[int, set[tuple[int, int]]] = {}
    for workload_id, world_size, tp in session.execute(
        select(_P.workload_id, _P.world_size, _P.tp).where(in_project(project_id)).distinct()
    ):
        shapes.setdefault(workload_id, set()).add((world_size, tp or 1))
    variants = variants_by_workload(session, project_id)
    by_name: dict[str, list[Any]] = {}
    for row in rows:
        by_name.setdefault(row.name, []).append(row)
    groups = []
    for name in sorted(by_name):
        members = sorted(
            by_name[name],
            key=lambda r: (_MODE_ORDER.get(r.parallel_mode, 3), r.seq_len or 0, r.id),
        )
        labels = {}
        for r in members:
            # The model's name too: a closed menu shows the option, not its group.
            parts = [name, _runs_text(r.parallel_mode, sorted(shapes.get(r.id, ())))]
            if r.seq_len is not None:
                parts.append(f"seq {r.seq_len}")
            if variants.get(r.id):
                parts.append(variant_text(variants[r.id]))
            labels[r.id] = " · ".join(parts)
        groups.append(WorkloadGroup(name, _told_apart(members, labels)))
    return groups


def _told_apart(members: Sequence[Any], labels: dict[int, str]) -> list[Choice]:
    """Choices whose labels differ: where several read the same, each gains the columns
    in which those several differ; the key's first 8 characters only if none does."""
    same: dict[str, list[Any]] = {}
    for r in members:
        same.setdefault(labels[r.id], []).append(r)
    columns = (
        ("precision", lambda r: r.precision),
        ("optimizer", lambda r: r.optimizer),
        ("checkpointing", lambda r: "on" if r.activation_checkpointing else "off"),
        ("parameters", lambda r: fmt_int(r.parameter_count)),
    )
    choices = []
    for r in members:
        label = labels[r.id]
        twins = same[label]
        if len(twins) > 1:
            differ = [
                f"{what} {value(r)}"
                for what, value in columns
                if len({value(t) for t in twins}) > 1
            ]
            label = " · ".join([label, *differ]) if differ else f"{label} · {r.key[:8]}"
        choices.append(Choice(r.id, label, r.key))
    return choices


def most_profiled_workload(session: Session, project_id: int) -> str | None:
    """The key of the project's workload with the most profiles in which something fits
    (the newest profiled among equals): what a reader with no question of their own is
    asked about first, since the workload a team keeps profiling is the one it trains."""
    found = session.execute(
        select(_W.key)
        .join(_P, _P.workload_id == _W.id)
        .where(_W.project_id == project_id, _P.max_micro_batch_size > 0)
        .group_by(_W.id, _W.key)
        .order_by(func.count(_P.id).desc(), func.max(_P.received_at).desc(), _W.id.desc())
        .limit(1)
    ).first()
    return found[0] if found is not None else None


@dataclass(frozen=True)
class NewestRun:
    """The run the newest profile measured: what the landing page asks about first."""

    workload_key: str
    device_key: str
    world_size: int
    parallel_mode: str
    max_micro_batch_size: int
    tp: int = 1


@dataclass(frozen=True)
class QuestionChoices:
    workloads: list[WorkloadGroup]
    devices: list[Choice]
    newest: NewestRun | None


def question_choices(
    session: Session, *, project_id: int, workload: str | None = None, device: str | None = None
) -> QuestionChoices:
    """The calculator's menus and the run it asks about where the question leaves a field
    out: the run of the newest profile of the workload and device asked (by key), else of
    that workload on any device, else on that device, else the newest profile's. So asking
    about another workload asks at its own world size, parallel mode and mesh. A question
    that names neither asks about the most profiled workload
    (:func:`most_profiled_workload`), at its newest profile's run."""
    if not workload and not device:
        workload = most_profiled_workload(session, project_id)
    newest_first = (
        select(_W.key, _D.key, _P.world_size, _P.parallel_mode, _P.max_micro_batch_size, _P.tp)
        .join(_W, _W.id == _P.workload_id)
        .join(_D, _D.id == _P.device_id)
        .where(_W.project_id == project_id)
        .order_by(_P.received_at.desc(), _P.id.desc())
        .limit(1)
    )
    # The rows the references mean, as an answer reads them (key, else the owner's name).
    by_workload = (
        [_W.id == _reference_id(session, models.Workload, workload, project_id)] if workload else []
    )
    by_device = (
        [_D.id == _reference_id(session, models.Device, device, project_id)] if device else []
    )
    newest = None
    for where in (by_workload + by_device, by_workload, by_device, []):
        newest = session.execute(newest_first.where(*where)).first()
        if newest is not None:
            break
    return QuestionChoices(
        workloads=workload_groups(session, project_id),
        devices=device_choices(session, project_id),
        newest=NewestRun(*newest[:5], tp=newest[5] or 1) if newest is not None else None,
    )


def _reference_id(
    session: Session,
    table: type[models.Workload] | type[models.Device],
    reference: str,
    project_id: int,
) -> int | None:
    """The project's row ``reference`` means (:mod:`tuner.answer.identity`), or ``None``."""
    try:
        if table is models.Workload:
            return find_workload(session, reference, project_id=project_id).id
        return find_device(session, reference, project_id=project_id).id
    except NotFoundError:
        return None


def profile_count(session: Session, project_id: int) -> int:
    return session.scalar(select(func.count()).select_from(_P).where(in_project(project_id))) or 0


# One profile


@dataclass(frozen=True)
class OomReportRow:
    micro_batch_size: int
    message: str | None
    created_at: datetime


@dataclass(frozen=True)
class ProfileDetail:
    profile: ProfilePublic
    newest_id: int
    oom_reports: list[OomReportRow]
    oom_limit: int | None = None  # what answers stay below, as the recommendation reads it

    @property
    def superseded(self) -> bool:
        return self.newest_id != self.profile.id

    @property
    def at_max(self) -> ProbeResult | None:
        """The probe the recommendation reads at M*: the last one that fit there."""
        found = [
            p
            for p in self.profile.probes
            if p.fits and p.micro_batch_size == self.profile.max_micro_batch_size
        ]
        return found[-1] if found else None

    @property
    def status(self) -> Status:
        return profile_status(
            max_micro_batch_size=self.profile.max_micro_batch_size,
            size_cap=self.profile.size_cap,
            superseded=self.superseded,
            oom_limit=self.oom_limit,
        )


def profile_detail(session: Session, profile_id: int, *, project_id: int) -> ProfileDetail:
    """One profile of the project, whether it is current and what caps it
    (:mod:`tuner.answer.current`), and the OOM reports made since it was received."""
    row = get_profile(session, profile_id, project_id=project_id)
    evidence = SqlEvidence(session, project_id)
    profiles = evidence.profiles([row.workload_id])
    this = next(p for p in profiles if p.id == row.id)
    newest = current.current_at(profiles, row.workload_id, row.device_id, this.mesh)
    reports = [
        report
        for report in evidence.oom_reports([row.workload_id])
        if current.caps(report, row.workload_id, row.device_id)
        and report.created_at > this.received_at
    ]
    messages = dict(
        session.execute(
            select(models.OomReport.id, models.OomReport.message).where(
                models.OomReport.id.in_([report.id for report in reports])
            )
        ).all()
    )
    reports.sort(key=lambda report: report.created_at, reverse=True)
    return ProfileDetail(
        profile=to_public(row),
        newest_id=newest.id if newest is not None else row.id,
        oom_reports=[
            OomReportRow(r.micro_batch_size, messages.get(r.id), r.created_at) for r in reports[:20]
        ],
        oom_limit=current.profile_cap(this, reports),
    )


# Workloads


@dataclass(frozen=True)
class WorkloadSummary:
    id: int
    key: str
    name: str
    target: str | None
    precision: str
    optimizer: str
    parameter_count: int
    activation_checkpointing: bool
    profiles: int
    devices: int
    last_profiled_at: datetime | None
    parallel_mode: str = "none"
    seq_len: int | None = None
    variant: dict[str, Any] = field(default_factory=dict)


WORKLOAD_LIST_LIMIT = 1000


def list_workloads(session: Session, project_id: int) -> list[WorkloadSummary]:
    """Every workload of the project with how many profiles and devices it has; most
    recently profiled first."""
    last = func.max(_P.created_at)
    statement = (
        select(
            _W.id,
            _W.key,
            _W.name,
            _W.target,
            _W.precision,
            _W.optimizer,
            _W.parameter_count,
            _W.activation_checkpointing,
            func.count(_P.id),
            func.count(func.distinct(_P.device_id)),
            last,
            _W.parallel_mode,
            _W.seq_len,
        )
        .outerjoin(_P, _P.workload_id == _W.id)
        .where(_W.project_id == project_id)
        .group_by(_W.id)
        .order_by(last.desc().nulls_last(), _W.name)
        .limit(WORKLOAD_LIST_LIMIT)
    )
    variants = variants_by_workload(session, project_id)
    return [
        WorkloadSummary(*row, variant=variants.get(row[0], {}))
        for row in session.execute(statement)
    ]


@dataclass(frozen=True)
class WorkloadDetail:
    workload: models.Workload
    results: list[DeviceResult] = field(default_factory=list)

    @property
    def largest_max(self) -> int:
        return max((r.max_micro_batch_size or 0 for r in self.results), default=0)

    @property
    def fastest(self) -> float:
        return max((r.samples_per_second or 0.0 for r in self.results), default=0.0)


def workload_detail(session: Session, workload_id: int, *, project_id: int) -> WorkloadDetail:
    """The workload's M* and throughput on every device of its project, side by side: the
    evidence read here, measured or estimated decided by
    :func:`tuner.answer.devices.on_every_device`."""
    workload = get_workload(session, workload_id, project_id=project_id)
    evidence = SqlEvidence(session, project_id)
    profiles = evidence.profiles([workload_id])
    of_project = _DEVICES.where(_D.project_id == project_id).order_by(_D.name, _D.id)
    devices = [device_row(row) for row in session.execute(of_project)]
    shown = {
        shapes[0].id
        for device in devices
        if (shapes := current.current_per_shape(profiles, workload_id, device.id))
    }
    results = on_every_device(
        devices, profiles, evidence.probes(shown), evidence.oom_reports([workload_id])
    )
    return WorkloadDetail(workload=workload, results=results)


_DEVICES = select(_D.id, _D.key, _D.name, _D.capacity_bytes, _D.kind, _D.registered_by)


# Devices


@dataclass(frozen=True)
class DeviceSummary:
    id: int
    key: str
    name: str
    kind: str
    capacity_bytes: int
    profiles: int
    workloads: int
    workers: int
    last_profiled_at: datetime | None


def list_devices(session: Session, project_id: int) -> list[DeviceSummary]:
    """Every device of the project with how much was measured on it and how many workers
    serve it; the most recently profiled first. One statement."""
    workers = (
        select(func.count(models.Worker.id))
        .where(models.Worker.device_id == _D.id)
        .scalar_subquery()
    )
    last = func.max(_P.created_at)
    statement = (
        select(
            _D.id,
            _D.key,
            _D.name,
            _D.kind,
            _D.capacity_bytes,
            func.count(_P.id),
            func.count(func.distinct(_P.workload_id)),
            workers,
            last,
        )
        .outerjoin(_P, _P.device_id == _D.id)
        .where(_D.project_id == project_id)
        .group_by(_D.id)
        .order_by(last.desc().nulls_last(), _D.name, _D.id)
    )
    return [DeviceSummary(*row) for row in session.execute(statement)]


# Sequence-length families


@dataclass(frozen=True)
class LengthFamilyRows:
    """A length family: one of its workloads (what the lengths share), and the newest
    one-process profile of each of its workloads on each device, newest first."""

    key: str
    workload: models.Workload
    profiles: list[models.Profile]


def length_family(session: Session, key: str, *, project_id: int) -> LengthFamilyRows:
    """The project's family's profiles at world size 1: one statement for the rows
    (workload and device joined), one for their probes; one more only when none was
    profiled yet."""
    members = session.scalars(
        select(_W.id).where(
            _W.project_id == project_id, _W.length_family == key, _W.seq_len.is_not(None)
        )
    ).all()
    heads = SqlEvidence(session, project_id).profiles(members)
    shown = {
        found.id
        for row in heads
        if (found := current.current_at(heads, row.workload_id, row.device_id, ONE_PROCESS))
    }
    profiles = session.scalars(
        select(_P).where(_P.id.in_(shown)).order_by(_P.received_at.desc(), _P.id.desc())
    ).all()
    workload = (
        profiles[0].workload
        if profiles
        else session.scalar(
            select(_W)
            .where(_W.project_id == project_id, _W.length_family == key)
            .order_by(_W.seq_len, _W.id)
            .limit(1)
        )
    )
    if workload is None:
        raise NotFoundError(
            f"no sequence-length family {key!r}: a workload page links its family when it has one"
        )
    return LengthFamilyRows(key=key, workload=workload, profiles=list(profiles))


# Jobs and workers


@dataclass(frozen=True)
class JobRow:
    id: int
    target: str
    options: dict[str, Any]
    device: str
    status: str
    attempts: int
    max_attempts: int
    worker_id: int | None
    worker_name: str | None
    lease_expires_at: datetime | None
    profile_id: int | None
    error: str | None
    created_at: datetime
    updated_at: datetime

    def lease_expired(self, now: datetime) -> bool:
        return (
            self.status == "running"
            and self.lease_expires_at is not None
            and self.lease_expires_at < now
        )


@dataclass(frozen=True)
class WorkerRow:
    id: int
    name: str
    device_name: str
    device_key: str
    registered_at: datetime
    last_heartbeat_at: datetime
    running_job_id: int | None
    left_at: datetime | None = None


@dataclass(frozen=True)
class JobsOverview:
    counts: dict[str, int]
    running: list[JobRow]
    queued: list[JobRow]
    failed: list[JobRow]
    succeeded: list[JobRow]
    workers: list[WorkerRow]

    @property
    def empty(self) -> bool:
        return not any(self.counts.values())


JOBS_SHOWN = 100
SUCCEEDED_SHOWN = 10


def jobs_overview(session: Session, project_id: int) -> JobsOverview:
    """Running, queued (oldest first: the order workers claim them), failed and recently
    succeeded jobs, and every worker. Read-only: expired leases are shown as expired and
    left for the next claim or API read to sweep."""
    counts = {status: 0 for status in ("queued", "running", "failed", "succeeded")}
    counts.update(
        dict(
            session.execute(
                select(models.Job.status, func.count(models.Job.id))
                .where(models.Job.project_id == project_id)
                .group_by(models.Job.status)
            ).all()
        )
    )
    of_project = models.Worker.project_id == project_id
    worker_names = dict(
        session.execute(select(models.Worker.id, models.Worker.name).where(of_project)).all()
    )

    def jobs(status: str, *, oldest_first: bool, limit: int) -> list[JobRow]:
        order = (
            (models.Job.created_at.asc(), models.Job.id.asc())
            if oldest_first
            else (models.Job.updated_at.desc(), models.Job.id.desc())
        )
        rows = session.scalars(
            select(models.Job)
            .where(models.Job.project_id == project_id, models.Job.status == status)
            .order_by(*order)
            .limit(limit)
        ).all()
        return [
            JobRow(
                id=job.id,
                target=job.target,
                options=dict(job.options),
                device=job.device,
                status=job.status,
                attempts=job.attempts,
                max_attempts=job.max_attempts,
                worker_id=job.worker_id,
                worker_name=worker_names.get(job.worker_id) if job.worker_id else None,
                lease_expires_at=job.lease_expires_at,
                profile_id=job.profile_id,
                error=job.error,
                created_at=job.created_at,
                updated_at=job.updated_at,
            )
            for job in rows
        ]

    running = jobs("running", oldest_first=True, limit=JOBS_SHOWN)
    running_by_worker = {job.worker_id: job.id for job in running if job.worker_id is not None}
    workers = [
        WorkerRow(
            id=worker.id,
            name=worker.name,
            device_name=worker.device.name,
            device_key=worker.device.key,
            registered_at=worker.registered_at,
            last_heartbeat_at=worker.last_heartbeat_at,
            running_job_id=running_by_worker.get(worker.id),
            left_at=worker.left_at,
        )
        for worker in session.scalars(
            select(models.Worker).where(of_project).order_by(models.Worker.last_heartbeat_at.desc())
        )
    ]
    return JobsOverview(
        counts=counts,
        running=running,
        queued=jobs("queued", oldest_first=True, limit=JOBS_SHOWN),
        failed=jobs("failed", oldest_first=False, limit=JOBS_SHOWN),
        succeeded=jobs("succeeded", oldest_first=False, limit=SUCCEEDED_SHOWN),
        workers=workers,
    )
