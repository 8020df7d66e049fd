"""Tables: projects; devices, workloads, profiles and their probes, jobs, workers, tokens,
OOM reports.

Every workload, device, job, worker and OOM report belongs to one project (profiles and
their probes through their workload), and every token to one, or, for an admin token, to
all. A key is unique within its project: two teams that profile the same model each have
their own row, and neither's answers rest on the other's evidence.

Byte counts are 64-bit. Timestamps are stored in UTC and read back timezone-aware on
every database. Constraint names follow one convention so that migrations can name them
on SQLite (batch mode) and PostgreSQL alike.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC in Python, whatever the database keeps."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are ambiguous; pass a timezone-aware one")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSON(),
    }


DEFAULT_PROJECT_ID = 1  # the project every row stored before projects belongs to (0015)
DEFAULT_PROJECT = "default"


class Project(Base):
    """A team's own store within the service: its tokens write and read only its rows."""

    __tablename__ = "projects"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


def _project_column() -> Mapped[int]:
    # No foreign key: SQLite cannot add one to a table in place (see migration 0015);
    # projects are never deleted.
    return mapped_column(
        Integer, default=DEFAULT_PROJECT_ID, server_default=str(DEFAULT_PROJECT_ID), index=True
    )


class Device(Base):
    __tablename__ = "devices"
    __table_args__ = (UniqueConstraint("project_id", "key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = _project_column()
    key: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(200), index=True)
    capacity_bytes: Mapped[int] = mapped_column(BigInteger)
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # The token that registered it (migration 0010): a name belongs to the registrant of
    # its first row, and resolves among that registrant's rows only (tuner.answer.identity).
    # None for rows stored before, and for stores without tokens.
    registered_by: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Workload(Base):
    __tablename__ = "workloads"
    __table_args__ = (UniqueConstraint("project_id", "key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = _project_column()
    key: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(200), index=True)
    target: Mapped[str | None] = mapped_column(String(500))
    precision: Mapped[str] = mapped_column(String(8))
    activation_checkpointing: Mapped[bool] = mapped_column(Boolean)
    parameter_count: Mapped[int] = mapped_column(BigInteger)
    optimizer: Mapped[str] = mapped_column(String(100))
    # none, ddp or fsdp: part of the key when not none, so one name may have a workload
    # of each mode; a question that names the mode picks among them.
    parallel_mode: Mapped[str] = mapped_column(String(8), default="none", server_default="none")
    # The length every sample has, when built for one (migration 0009); workloads that
    # differ only in length share a family, which answers for lengths nobody profiled.
    seq_len: Mapped[int | None] = mapped_column(Integer)
    length_family: Mapped[str | None] = mapped_column(String(64), index=True)
    # The token that registered it (migration 0010): a name belongs to the registrant of
    # its first row, and resolves among that registrant's rows only (tuner.answer.identity).
    # None for rows stored before, and for stores without tokens.
    registered_by: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Profile(Base):
    """One search's outcome. Written whole with its probes in one transaction; older
    profiles of the same workload and device stay as history."""

    __tablename__ = "profiles"
    __table_args__ = (
        # The newest profile of a pair is one index probe. Unique, so that an upload sent
        # twice (a retry after a lost response) is recognised instead of stored twice.
        Index(
            "uq_profiles_workload_device_created",
            "workload_id",
            "device_id",
            "created_at",
            unique=True,
        ),
        # Listing is newest first with keyset pagination on (created_at, id), unfiltered or
        # filtered by workload or by device; each order has an index that yields it directly.
        Index("ix_profiles_created_id", "created_at", "id"),
        Index("ix_profiles_workload_created_id", "workload_id", "created_at", "id"),
        Index("ix_profiles_device_created_id", "device_id", "created_at", "id"),
        # The newest profile of a pair at one world size is one index probe too.
        Index(
            "ix_profiles_workload_device_world_created",
            "workload_id",
            "device_id",
            "world_size",
            "created_at",
        ),
        # Newest means received last, by the service's clock (migration 0008): the
        # indexes that list and pick profiles in that order.
        Index("ix_profiles_received_id", "received_at", "id"),
        Index("ix_profiles_workload_received_id", "workload_id", "received_at", "id"),
        Index("ix_profiles_device_received_id", "device_id", "received_at", "id"),
        # ... at one mesh shape, (world_size, tp) (migration 0013).
        Index(
            "ix_profiles_workload_device_world_tp_received",
            "workload_id",
            "device_id",
            "world_size",
            "tp",
            "received_at",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id", ondelete="CASCADE"))
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"))
    # The measuring machine's clock: information, and the upload's identity.
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # The service's clock when it stored the row: what orders and compares profiles.
    # Nullable only in the schema (rows of old revisions were backfilled; every write sets it).
    received_at: Mapped[datetime | None] = mapped_column(default=utcnow)
    headroom: Mapped[float] = mapped_column(Float)
    budget_bytes: Mapped[int] = mapped_column(BigInteger)
    strategy: Mapped[str] = mapped_column(String(32))
    size_cap: Mapped[int] = mapped_column(Integer)
    max_micro_batch_size: Mapped[int] = mapped_column(Integer)
    fit_fixed_bytes: Mapped[float | None] = mapped_column(Float)
    fit_bytes_per_sample: Mapped[float | None] = mapped_column(Float)
    fit_points: Mapped[int | None] = mapped_column(Integer)
    settings: Mapped[dict[str, Any]] = mapped_column(default=dict)
    oversize_probe: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    wall_time_s: Mapped[float] = mapped_column(Float)
    # Ranks the probes ran on, and how (``tuner.core.parallel.Parallel`` as JSON);
    # ``parallel_mode`` repeats its mode as a column that queries filter on.
    world_size: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    # The mesh's tensor-parallel degree (``parallel.tp``; 1 without a mesh), so that the
    # newest profile at a mesh shape (world_size, tp) is one index probe (0013).
    tp: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    parallel_mode: Mapped[str] = mapped_column(String(8), default="none", server_default="none")
    parallel: Mapped[dict[str, Any]] = mapped_column(
        default=lambda: {"mode": "none"}, server_default='{"mode": "none"}'
    )
    # The workload options this profile measured when it is one variant of an exploration,
    # and the key the exploration's profiles share (``tuner profile --explore``).
    variant: Mapped[dict[str, Any]] = mapped_column(default=dict, server_default="{}")
    variant_group: Mapped[str | None] = mapped_column(String(64), index=True)
    # The variant its exploration chose (by its plan's measured speed); kept since 0012.
    variant_chosen: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Micro batches timed at a few sizes after M* (``tuner.core.speeds.SpeedCurve`` as
    # JSON; bounded by its schema): what answers compare splits by. Since 0017.
    speeds: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    workload: Mapped[Workload] = relationship(lazy="joined", innerjoin=True)
    device: Mapped[Device] = relationship(lazy="joined", innerjoin=True)
    probes: Mapped[list[Probe]] = relationship(
        back_populates="profile",
        order_by="Probe.ordinal",
        cascade="all, delete-orphan",
        lazy="selectin",
    )


class Probe(Base):
    __tablename__ = "probes"
    __table_args__ = (UniqueConstraint("profile_id", "ordinal"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    profile_id: Mapped[int] = mapped_column(ForeignKey("profiles.id", ondelete="CASCADE"))
    ordinal: Mapped[int] = mapped_column(Integer)
    micro_batch_size: Mapped[int] = mapped_column(Integer)
    fits: Mapped[bool] = mapped_column(Boolean)
    oom: Mapped[bool] = mapped_column(Boolean)
    peak_allocated_bytes: Mapped[int | None] = mapped_column(BigInteger)
    peak_reserved_bytes: Mapped[int | None] = mapped_column(BigInteger)
    non_torch_bytes: Mapped[int] = mapped_column(BigInteger)
    alloc_retries: Mapped[int] = mapped_column(Integer)
    phase_peaks_bytes: Mapped[dict[str, Any]] = mapped_column(default=dict)
    breakdown: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # At a world size: each rank's reserved peak and breakdown (empty in one process).
    rank_peaks_bytes: Mapped[list[int]] = mapped_column(JSON, default=list, server_default="[]")
    rank_breakdowns: Mapped[list[dict[str, Any]]] = mapped_column(
        JSON, default=list, server_default="[]"
    )
    step_time_s: Mapped[float | None] = mapped_column(Float)
    samples_per_second: Mapped[float | None] = mapped_column(Float)
    steps_run: Mapped[int] = mapped_column(Integer)
    wall_time_s: Mapped[float] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    # Live bytes over the measured step (``tuner.core.timeline``, at most ~96 KB as JSON),
    # kept for the probe at M*; none for the other probes and for rows stored before 0018.
    timeline: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    profile: Mapped[Profile] = relationship(back_populates="probes")


class Worker(Base):
    __tablename__ = "workers"
    __table_args__ = (
        Index("ix_workers_token_idempotency", "token_id", "idempotency_key", unique=True),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = _project_column()
    name: Mapped[str] = mapped_column(String(200))
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"), index=True)
    # The token that registered it: only that token (or an admin's) acts for it. None for
    # workers registered before tokens were bound. No foreign key: tokens are revoked,
    # never deleted (and see migration 0007).
    token_id: Mapped[int | None] = mapped_column(Integer, index=True)
    # The registering client's key for this registration: a retry returns this worker.
    idempotency_key: Mapped[str | None] = mapped_column(String(64))
    request_digest: Mapped[str | None] = mapped_column(String(64))
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow)
    # When it said it stops on purpose (migration 0016); None while it runs, and for one
    # that stopped without a word (killed, crashed): that one goes silent.
    left_at: Mapped[datetime | None] = mapped_column()

    device: Mapped[Device] = relationship(lazy="joined", innerjoin=True)


class Job(Base):
    """A profiling job. ``device`` is the device key or device name it must run on.

    A claim sets ``lease_id`` and ``lease_expires_at``; a result is accepted only under the
    current lease, so a worker whose lease expired cannot store a second result.
    """

    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_status_device", "status", "device"),
        Index("ix_jobs_token_idempotency", "token_id", "idempotency_key", unique=True),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = _project_column()
    target: Mapped[str] = mapped_column(String(500))
    options: Mapped[dict[str, Any]] = mapped_column(default=dict)
    settings: Mapped[dict[str, Any]] = mapped_column(default=dict)
    device: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer)
    worker_id: Mapped[int | None] = mapped_column(ForeignKey("workers.id", ondelete="SET NULL"))
    lease_id: Mapped[str | None] = mapped_column(String(64))
    lease_expires_at: Mapped[datetime | None] = mapped_column()
    profile_id: Mapped[int | None] = mapped_column(ForeignKey("profiles.id", ondelete="SET NULL"))
    error: Mapped[str | None] = mapped_column(Text)
    # Who queued it (migration 0011; None for jobs queued before): what the job measures is
    # registered in that token's name, not the worker's, and with the client's key for the
    # request a retry returns this job.
    token_id: Mapped[int | None] = mapped_column(Integer)
    idempotency_key: Mapped[str | None] = mapped_column(String(64))
    request_digest: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiToken(Base):
    """An API token. Only its SHA-256 is kept; ``prefix`` lets a person tell tokens apart."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    prefix: Mapped[str] = mapped_column(String(32))
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[str] = mapped_column(String(100))
    # The project it reads and writes; None: every project (admin tokens only).
    project_id: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column()
    revoked_at: Mapped[datetime | None] = mapped_column()


class OomReport(Base):
    """An out-of-memory seen in training at ``micro_batch_size``: recommendations for this
    workload and device stay below it until a newer profile exists."""

    __tablename__ = "oom_reports"
    __table_args__ = (
        Index("ix_oom_reports_workload_device", "workload_id", "device_id"),
        Index("ix_oom_reports_token_idempotency", "token_id", "idempotency_key", unique=True),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = _project_column()
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id", ondelete="CASCADE"))
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"))
    micro_batch_size: Mapped[int] = mapped_column(Integer)
    # The size the run went on with: answers stay at or below it.
    settled_micro_batch_size: Mapped[int | None] = mapped_column(Integer)
    # The profile the plan that failed came from, when the reporter said (migration 0014).
    # A plain column (SQLite cannot add a foreign key in place); checked when stored.
    profile_id: Mapped[int | None] = mapped_column(Integer)
    # Chosen by the reporter for one event: a retry or another rank's copy counts once.
    # Keys belong to the token that sent them (None: stored before keys were scoped).
    token_id: Mapped[int | None] = mapped_column(Integer)
    idempotency_key: Mapped[str | None] = mapped_column(String(64))
    request_digest: Mapped[str | None] = mapped_column(String(64))
    message: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class StoreState(Base):
    """One row: the store's generation, raised by every write that can change an answer.

    Service processes cache recommendations and token checks under the generation they
    were computed at, and read it (one tiny query) on each request: a cache entry is used
    only while nothing has changed, whichever process wrote.
    """

    __tablename__ = "store_state"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    generation: Mapped[int] = mapped_column(BigInteger)
