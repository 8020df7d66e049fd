"""Devices, workloads and profiles. A profile is written whole, with its device, workload
and probes, inside the caller's one transaction, or not at all.

Writes are safe under concurrency on both databases: a new device or workload is inserted
with ``ON CONFLICT DO NOTHING`` and read back, so two first uploads from one device never
collide, and a profile sent twice (a retry after a lost response) is stored once.
"""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import ColumnElement, and_, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import InstrumentedAttribute, Session, lazyload

from api import models
from api.store.evidence import SqlEvidence
from api.store.generation import mark_changed
from api.store.paging import keyset_page
from api.store.projects import in_project
from api.store.rows import get_or_404
from api.store.variant_rows import check_one_chosen, variant_columns, variant_fields
from tuner.answer import current, identity
from tuner.answer.evidence import ProfileRow, workload_info
from tuner.core import results
from tuner.core.errors import ConflictError, NotFoundError
from tuner.core.parallel import Parallel
from tuner.core.speeds import SpeedCurve
from tuner.core.timeline import MemoryTimeline
from tuner.core.wire.common import API_PREFIX, PageQuery
from tuner.core.wire.devices import DeviceCreate
from tuner.core.wire.profiles import ProfilePublic, ProfileQuery, ProfileSummary
from tuner.core.wire.workloads import WorkloadCreate

Keyed = TypeVar("Keyed", models.Device, models.Workload)


def _get_or_insert(
    session: Session,
    table: type[Keyed],
    key: str,
    values: dict[str, Any],
    registered_by: int | None,
    project_id: int,
) -> Keyed:
    """The row of project ``project_id`` with ``key``, inserted with ``values`` first if
    missing, registered by the token ``registered_by`` (whose name it then bears,
    :mod:`tuner.answer.identity`). Another project's row of the same key is not this one.

    ``INSERT ... ON CONFLICT (project_id, key) DO NOTHING``: a concurrent first insert of
    the same key makes this a no-op (PostgreSQL waits for it to commit) instead of an
    integrity error.
    """
    by_key = select(table).where(table.project_id == project_id, table.key == key)
    row = session.scalar(by_key)
    if row is not None:
        return row
    family = values.get("length_family")
    check_identity(
        session, table, key=key, name=values["name"], family=family, project_id=project_id
    )
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    values = {
        "key": key,
        "project_id": project_id,
        "created_at": models.utcnow(),
        "registered_by": registered_by,
        **values,
    }
    result = session.execute(
        insert(table).values(**values).on_conflict_do_nothing(index_elements=["project_id", "key"])
    )
    if result.rowcount:  # type: ignore[attr-defined]
        mark_changed(session)  # a new name to resolve, a new device to estimate for
    return session.scalars(by_key).one()


def check_identity(
    session: Session,
    table: type[models.Workload] | type[models.Device],
    *,
    key: str,
    project_id: int,
    name: str | None = None,
    family: str | None = None,
) -> None:
    """Refuse a new key, name or length-family key that another row of the project already
    bears in another role: a reference means a key, else a name, else a family
    (:mod:`tuner.answer.identity`), so one written in another's role could take over what
    that reference answers. Other projects' rows answer other projects' questions only."""
    what = "workload" if table is models.Workload else "device"
    clashes: list[tuple[str, Any]] = [
        (
            f"the key {key!r} is the name of another {what}",
            and_(table.name == key, table.key != key),
        )
    ]
    if name is not None and name != key:
        clashes.append((f"the name {name!r} is the key of another {what}", table.key == name))
    if table is models.Workload:
        workload = models.Workload
        clashes.append((f"the key {key!r} is a length family's key", workload.length_family == key))
        if name is not None and name != key:
            clashes.append(
                (f"the name {name!r} is a length family's key", workload.length_family == name)
            )
        if family is not None:
            clashes.append(
                (
                    f"the length family {family!r} is the key or name of a workload",
                    or_(workload.key == family, workload.name == family),
                )
            )
    for message, condition in clashes:
        found = select(table.id).where(table.project_id == project_id, condition).limit(1)
        if session.scalar(found) is not None:
            raise ConflictError(
                f"{message}: keys, names and length families must not be confused; "
                "rename it (a key comes from `tuner profile`)"
            )


def upsert_device(
    session: Session,
    key: str,
    info: results.DeviceInfo,
    *,
    project_id: int,
    registered_by: int | None = None,
) -> models.Device:
    """The project's device with ``key``, created from ``info`` by the token
    ``registered_by`` if new (a key names its properties)."""
    values = {
        "kind": info.kind,
        "name": info.name,
        "capacity_bytes": info.capacity_bytes,
        "details": dict(info.details),
    }
    return _get_or_insert(session, models.Device, key, values, registered_by, project_id)


def upsert_workload(
    session: Session,
    key: str,
    info: results.WorkloadInfo,
    *,
    project_id: int,
    parallel_mode: str = "none",
    registered_by: int | None = None,
) -> models.Workload:
    """The project's workload with ``key``, created from ``info`` by the token
    ``registered_by`` if new (``parallel_mode`` is part of the key, so a key has one mode)."""
    values = {
        "parallel_mode": parallel_mode,
        "name": info.name,
        "target": info.target,
        "precision": info.precision,
        "activation_checkpointing": info.activation_checkpointing,
        "parameter_count": info.parameter_count,
        "optimizer": info.optimizer,
        "seq_len": info.seq_len,
        "length_family": info.length_family,
    }
    workload = _get_or_insert(session, models.Workload, key, values, registered_by, project_id)
    if workload.length_family is None and info.length_family is not None:
        check_identity(
            session, models.Workload, key=key, family=info.length_family, project_id=project_id
        )
        # Profiled at this length alone before, now as one length of a family: the same
        # key (the same shapes), which joins the family from here on.
        workload.length_family = info.length_family
        workload.seq_len = info.seq_len
        mark_changed(session)
    return workload


def create_device(
    session: Session, body: DeviceCreate, *, project_id: int, registered_by: int | None = None
) -> tuple[models.Device, bool]:
    """Register a device; the same registration again is answered with the stored one."""
    existing = session.scalar(
        select(models.Device).where(
            models.Device.project_id == project_id, models.Device.key == body.key
        )
    )
    device = upsert_device(
        session, body.key, body, project_id=project_id, registered_by=registered_by
    )
    if existing is not None and (device.kind, device.name, device.capacity_bytes) != (
        body.kind,
        body.name,
        body.capacity_bytes,
    ):
        raise ConflictError(
            f"device key {body.key} is registered already as {device.kind} {device.name!r} "
            f"with {device.capacity_bytes} bytes: a key names one device's properties, so "
            "register a different device under its own key"
        )
    return device, existing is None


def create_workload(
    session: Session, body: WorkloadCreate, *, project_id: int, registered_by: int | None = None
) -> tuple[models.Workload, bool]:
    """Register a workload; the same registration again is answered with the stored one."""
    existing = session.scalar(
        select(models.Workload).where(
            models.Workload.project_id == project_id, models.Workload.key == body.key
        )
    )
    workload = upsert_workload(
        session, body.key, body, project_id=project_id, registered_by=registered_by
    )
    stored = (workload.name, workload.precision, workload.activation_checkpointing)
    if existing is not None and stored != (
        body.name,
        body.precision,
        body.activation_checkpointing,
    ):
        raise ConflictError(
            f"workload key {body.key} is registered already as {workload.name!r} "
            f"({workload.precision}): a key names one workload, so register a different "
            "workload under its own key"
        )
    return workload, existing is None


def get_device(session: Session, device_id: int, *, project_id: int) -> models.Device:
    return get_or_404(
        session,
        models.Device,
        device_id,
        missing=f"no device with id {{id}}: GET {API_PREFIX}/devices lists them",
        project_id=project_id,
    )


def get_workload(session: Session, workload_id: int, *, project_id: int) -> models.Workload:
    return get_or_404(
        session,
        models.Workload,
        workload_id,
        missing=f"no workload with id {{id}}: GET {API_PREFIX}/workloads lists them",
        project_id=project_id,
    )


def list_devices(
    session: Session,
    query: PageQuery,
    *,
    project_id: int,
    kind: str | None = None,
    name: str | None = None,
) -> tuple[list[models.Device], int, str | None]:
    where: list[ColumnElement[bool]] = [models.Device.project_id == project_id]
    if kind is not None:
        where.append(models.Device.kind == kind)
    if name is not None:
        where.append(models.Device.name == name)
    return keyset_page(
        session,
        models.Device,
        created_at=models.Device.created_at,
        row_id=models.Device.id,
        where=where,
        query=query,
    )


def list_workloads(
    session: Session, query: PageQuery, *, project_id: int, name: str | None = None
) -> tuple[list[models.Workload], int, str | None]:
    where = [models.Workload.project_id == project_id]
    if name is not None:
        where.append(models.Workload.name == name)
    return keyset_page(
        session,
        models.Workload,
        created_at=models.Workload.created_at,
        row_id=models.Workload.id,
        where=where,
        query=query,
    )


def find_device(session: Session, reference: str, *, project_id: int) -> models.Device:
    """The project's device ``reference`` names (:mod:`tuner.answer.identity`)."""
    evidence = SqlEvidence(session, project_id)
    chosen = identity.choose_device(evidence.devices(reference), reference)
    return session.get_one(models.Device, chosen.id)


def find_workload(
    session: Session,
    reference: str,
    *,
    project_id: int,
    mode: str | None = None,
    seq_len: int | None = None,
) -> models.Workload:
    """The project's workload ``reference`` names for a question of ``mode`` and
    ``seq_len`` (:mod:`tuner.answer.identity`)."""
    evidence = SqlEvidence(session, project_id)
    rows = evidence.workloads(reference)
    profiles = evidence.profiles([row.id for row in identity.owned(rows, reference)])

    def speed_of(profile: ProfileRow) -> float:
        probes = evidence.probes([profile.id]).get(profile.id, ())
        return current.speed_at_max(profile, probes)

    chosen = identity.choose_workload(
        rows,
        reference,
        newest_of=lambda row: current.newest(p for p in profiles if p.workload_id == row.id),
        speed_of=speed_of,
        mode=mode,
        seq_len=seq_len,
    )
    return session.get_one(models.Workload, chosen.id)


def add_profile(
    session: Session,
    profile: results.Profile,
    *,
    project_id: int,
    registered_by: int | None = None,
) -> models.Profile:
    """Store ``profile`` with its probes; older profiles of the pair stay as history."""
    row, _created = save_profile(
        session, profile, project_id=project_id, registered_by=registered_by
    )
    return row


def save_profile(
    session: Session,
    profile: results.Profile,
    *,
    project_id: int,
    registered_by: int | None = None,
) -> tuple[models.Profile, bool]:
    """Store ``profile`` unless this very profile is stored already; say which happened.
    A new workload or device is registered by the token ``registered_by``.

    A profile is identified by its workload, device and ``created_at`` (the time it was
    measured): the same document again returns the stored row, a different one with the
    same three is refused, since history is never rewritten.
    """
    device = upsert_device(
        session,
        profile.device_key,
        profile.device,
        project_id=project_id,
        registered_by=registered_by,
    )
    workload = upsert_workload(
        session,
        profile.workload_key,
        profile.workload,
        project_id=project_id,
        parallel_mode=profile.parallel.mode,
        registered_by=registered_by,
    )
    existing = _same_profile(session, workload.id, device.id, profile)
    if existing is not None:
        return _check_identical(existing, profile), False
    check_one_chosen(session, profile, project_id=project_id)
    row = _profile_row(profile, workload, device)
    try:
        # A savepoint, so that losing a race to an identical upload (PostgreSQL waits for
        # the other transaction, then reports the unique index) leaves this one usable.
        with session.begin_nested():
            session.add(row)
            session.flush()
        mark_changed(session)
    except IntegrityError:
        existing = _same_profile(session, workload.id, device.id, profile)
        if existing is None:
            raise
        return _check_identical(existing, profile), False
    return row, True


def _same_profile(
    session: Session, workload_id: int, device_id: int, profile: results.Profile
) -> models.Profile | None:
    return session.scalar(
        select(models.Profile).where(
            models.Profile.workload_id == workload_id,
            models.Profile.device_id == device_id,
            models.Profile.created_at == profile.created_at,
        )
    )


# Device and workload rows are shared by key, so only what the profile owns is compared.
_OWN_FIELDS = {"workload", "device", "created_at"}


def _check_identical(row: models.Profile, profile: results.Profile) -> models.Profile:
    stored = to_result(row).model_dump(mode="json", exclude=_OWN_FIELDS)
    if stored != results.Profile.model_dump(profile, mode="json", exclude=_OWN_FIELDS):
        raise ConflictError(
            f"profile {row.id} of this workload and device, created at "
            f"{row.created_at.isoformat()}, is stored already with different contents: "
            "stored profiles are never replaced; upload a new profile with its own created_at"
        )
    return row


def _profile_row(
    profile: results.Profile, workload: models.Workload, device: models.Device
) -> models.Profile:
    return models.Profile(
        workload=workload,
        device=device,
        created_at=profile.created_at,
        headroom=profile.headroom,
        budget_bytes=profile.budget_bytes,
        strategy=profile.strategy,
        size_cap=profile.size_cap,
        max_micro_batch_size=profile.max_micro_batch_size,
        fit_fixed_bytes=profile.fit.fixed_bytes if profile.fit else None,
        fit_bytes_per_sample=profile.fit.bytes_per_sample if profile.fit else None,
        fit_points=profile.fit.points if profile.fit else None,
        settings=profile.settings.model_dump(mode="json"),
        oversize_probe=(
            # peak_bytes is computed from peak_reserved_bytes; stored, it would not read back.
            profile.oversize_probe.model_dump(mode="json", exclude={"peak_bytes"})
            if profile.oversize_probe
            else None
        ),
        **variant_columns(profile),
        speeds=profile.speeds.model_dump(mode="json") if profile.speeds else None,
        wall_time_s=profile.wall_time_s,
        world_size=profile.world_size,
        tp=profile.parallel.tp,
        parallel_mode=profile.parallel.mode,
        parallel=profile.parallel.model_dump(mode="json"),
        probes=[
            models.Probe(
                ordinal=index,
                micro_batch_size=probe.micro_batch_size,
                fits=probe.fits,
                oom=probe.oom,
                peak_allocated_bytes=probe.peak_allocated_bytes,
                peak_reserved_bytes=probe.peak_reserved_bytes,
                non_torch_bytes=probe.non_torch_bytes,
                alloc_retries=probe.alloc_retries,
                phase_peaks_bytes=dict(probe.phase_peaks_bytes),
                breakdown=probe.breakdown.model_dump(mode="json") if probe.breakdown else None,
                rank_peaks_bytes=list(probe.rank_peaks_bytes),
                rank_breakdowns=[b.model_dump(mode="json") for b in probe.rank_breakdowns],
                step_time_s=probe.step_time_s,
                samples_per_second=probe.samples_per_second,
                steps_run=probe.steps_run,
                wall_time_s=probe.wall_time_s,
                error=probe.error,
                timeline=probe.timeline.model_dump(mode="json") if probe.timeline else None,
            )
            for index, probe in enumerate(profile.probes)
        ],
    )


def fit_of(row: models.Profile) -> results.AffineFit | None:
    """The profile's affine fit, if its search had two sizes to fit through."""
    if row.fit_fixed_bytes is None or row.fit_bytes_per_sample is None:
        return None
    return results.AffineFit(
        fixed_bytes=row.fit_fixed_bytes,
        bytes_per_sample=row.fit_bytes_per_sample,
        points=row.fit_points or 0,
    )


def to_result(row: models.Profile) -> results.Profile:
    """The stored profile as the engine's own schema (what the client and plan take)."""
    fit = fit_of(row)
    return results.Profile(
        workload_key=row.workload.key,
        device_key=row.device.key,
        workload=workload_info(row.workload),
        device=results.DeviceInfo(
            kind=row.device.kind,
            name=row.device.name,
            capacity_bytes=row.device.capacity_bytes,
            details=row.device.details,
        ),
        headroom=row.headroom,
        budget_bytes=row.budget_bytes,
        strategy=row.strategy,
        size_cap=row.size_cap,
        max_micro_batch_size=row.max_micro_batch_size,
        probes=[
            results.ProbeResult(
                micro_batch_size=p.micro_batch_size,
                fits=p.fits,
                oom=p.oom,
                peak_allocated_bytes=p.peak_allocated_bytes,
                peak_reserved_bytes=p.peak_reserved_bytes,
                non_torch_bytes=p.non_torch_bytes,
                alloc_retries=p.alloc_retries,
                phase_peaks_bytes=p.phase_peaks_bytes,
                breakdown=results.MemoryBreakdown.model_validate(p.breakdown)
                if p.breakdown
                else None,
                rank_peaks_bytes=p.rank_peaks_bytes,
                rank_breakdowns=[
                    results.MemoryBreakdown.model_validate(b) for b in p.rank_breakdowns
                ],
                step_time_s=p.step_time_s,
                samples_per_second=p.samples_per_second,
                steps_run=p.steps_run,
                wall_time_s=p.wall_time_s,
                error=p.error,
                timeline=MemoryTimeline.model_validate(p.timeline) if p.timeline else None,
            )
            for p in row.probes
        ],
        oversize_probe=results.ProbeResult.model_validate(row.oversize_probe)
        if row.oversize_probe
        else None,
        fit=fit,
        **variant_fields(row),
        speeds=SpeedCurve.model_validate(row.speeds) if row.speeds else None,
        settings=results.ProbeSettings.model_validate(row.settings),
        world_size=row.world_size,
        parallel=Parallel.model_validate(row.parallel),
        wall_time_s=row.wall_time_s,
        created_at=row.created_at,
    )


def to_public(row: models.Profile) -> ProfilePublic:
    """The stored profile with its probes and ids, as the API answers it."""
    return ProfilePublic.model_validate(
        {
            **to_result(row).model_dump(),
            "id": row.id,
            "workload_id": row.workload_id,
            "device_id": row.device_id,
        }
    )


def to_summary(row: models.Profile) -> ProfileSummary:
    fit = fit_of(row)
    return ProfileSummary(
        id=row.id,
        workload_id=row.workload_id,
        workload_key=row.workload.key,
        workload_name=row.workload.name,
        device_id=row.device_id,
        device_key=row.device.key,
        device_name=row.device.name,
        created_at=row.created_at,
        received_at=row.received_at,
        max_micro_batch_size=row.max_micro_batch_size,
        headroom=row.headroom,
        budget_bytes=row.budget_bytes,
        strategy=row.strategy,
        size_cap=row.size_cap,
        fit=fit,
        wall_time_s=row.wall_time_s,
        world_size=row.world_size,
        parallel_mode=row.parallel_mode,
    )


def _matching(
    session: Session,
    column: InstrumentedAttribute[int],
    model: type[models.Workload] | type[models.Device],
    reference: str,
    project_id: int,
) -> ColumnElement[bool]:
    """``column`` names a row of the project that ``reference`` may name: its key, or a
    name among its owner's rows (:mod:`tuner.answer.identity`)."""
    evidence = SqlEvidence(session, project_id)
    rows = (
        evidence.workloads(reference) if model is models.Workload else evidence.devices(reference)
    )
    ids = [row.id for row in identity.owned(rows, reference)]
    return column == ids[0] if len(ids) == 1 else column.in_(ids)


def get_profile(session: Session, profile_id: int, *, project_id: int) -> models.Profile:
    missing = f"no profile with id {{id}}: GET {API_PREFIX}/profiles lists them"
    row = get_or_404(session, models.Profile, profile_id, missing=missing)
    if row.workload.project_id != project_id:  # another project's: as if there were none
        raise NotFoundError(missing.format(id=profile_id))
    return row


def list_profiles(
    session: Session, query: ProfileQuery, *, project_id: int
) -> tuple[list[models.Profile], int, str | None]:
    """The project's profiles matching the filters, newest first, without their probes."""
    where: list[ColumnElement[bool]] = [in_project(project_id)]
    # References are resolved first: one id (the usual case) is an equality, which lets the
    # (workload_id | device_id, received_at, id) index deliver rows already in page order.
    # Newest is received last, by the service's clock (the machine's can be off).
    if query.workload is not None:
        where.append(
            _matching(
                session, models.Profile.workload_id, models.Workload, query.workload, project_id
            )
        )
    if query.device is not None:
        where.append(
            _matching(session, models.Profile.device_id, models.Device, query.device, project_id)
        )
    if query.created_after is not None:
        where.append(models.Profile.created_at > query.created_after)
    if query.created_before is not None:
        where.append(models.Profile.created_at < query.created_before)
    return keyset_page(
        session,
        models.Profile,
        created_at=models.Profile.received_at,
        row_id=models.Profile.id,
        where=where,
        query=query,
        # Summaries never touch probes; loading them would cost a query per page for nothing.
        options=[lazyload(models.Profile.probes)],
    )
