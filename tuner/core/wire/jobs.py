"""Profiling jobs: what is queued, what a worker gets when it claims one, and what it sends
back under its lease."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    StringConstraints,
    field_validator,
    model_validator,
)

from tuner.core.errors import BadInputError
from tuner.core.parallel import ParallelMode
from tuner.core.shape import MeshShape
from tuner.core.units import parse_bytes
from tuner.core.wire.common import (
    Fraction,
    IdempotencyKey,
    LongText,
    Page,
    PageQuery,
    PositiveInt32,
    PositiveInt64,
    Reference,
    RequestModel,
    StrictBool,
)
from tuner.core.wire.profiles import ProfileCreate

JobStatus = Literal["queued", "running", "succeeded", "failed"]

Target = Annotated[
    str,
    StringConstraints(max_length=500, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"),
    Field(description="package.module:function returning a tuner.Workload"),
]
LeaseId = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[0-9a-f]+$")]


def _bytes(value: Any) -> Any:
    # People write "2GiB"; programs send integers. Both mean a byte count.
    if isinstance(value, str):
        try:
            return parse_bytes(value)
        except BadInputError as exc:
            raise ValueError(exc.message) from None
    return value


class JobSettings(RequestModel):
    """How the worker runs ``tuner profile``: the same meaning and defaults as its flags."""

    memory_limit_bytes: Annotated[PositiveInt64 | None, BeforeValidator(_bytes)] = Field(
        default=None,
        description="memory to fit in (bytes, or text like '2GiB'); on cuda it emulates a "
        "smaller card; unset: the worker's own --memory-limit",
    )
    headroom: Fraction = 0.05
    strategy: Literal["model", "bisect"] = "model"
    size_cap: PositiveInt32 = Field(default=4096, description="largest micro batch size to try")
    warmup_steps: PositiveInt32 = 2
    world_size: PositiveInt32 = Field(
        default=1,
        description="ranks to profile on (with parallel ddp or fsdp): a worker takes the job "
        "only when it has that many devices (CPU: processes)",
    )
    parallel: ParallelMode | None = Field(
        default=None, description="none, ddp or fsdp; unset: what the workload declares"
    )
    tp: PositiveInt32 | None = Field(
        default=None,
        description="with parallel fsdp: tensor-parallel ranks per data-parallel group, the "
        "world_size ranks laid out as a (world_size / tp) × tp mesh; unset: no mesh",
    )

    @model_validator(mode="after")
    def _mesh_divides_the_world(self) -> JobSettings:
        if self.tp is not None:
            try:
                MeshShape(self.world_size, self.tp)  # the shape's own rules
            except BadInputError as exc:
                raise ValueError(exc.message) from None
        if self.tp is not None and self.parallel not in (None, "fsdp"):
            raise ValueError(f"tp needs parallel fsdp, not {self.parallel}")
        return self


class JobCreate(RequestModel):
    target: Target = Field(examples=["examples.gpt:workload"])
    options: dict[str, JsonValue] = Field(
        default_factory=dict, description="keyword arguments for the workload factory"
    )
    settings: JobSettings = Field(default_factory=JobSettings)
    device: Reference = Field(
        description="the device key, or the device name (e.g. 'NVIDIA H100 80GB HBM3'), "
        "of the workers that may run it",
    )
    idempotency_key: IdempotencyKey | None = Field(
        default=None, description="one key per job to queue (the client sends one)"
    )

    @field_validator("options")
    @classmethod
    def _option_names(cls, options: dict[str, JsonValue]) -> dict[str, JsonValue]:
        bad = sorted(name for name in options if not name.isidentifier())
        if bad:
            raise ValueError(f"option names must be keyword argument names, not {bad}")
        return options


class JobPublic(BaseModel):
    """A job as anyone with read access sees it; the lease id is only ever given to the
    worker that holds it."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    target: str
    options: dict[str, JsonValue]
    settings: JobSettings
    device: str
    status: JobStatus
    attempts: int = Field(description="claims so far, the current one included")
    max_attempts: int
    worker_id: int | None
    lease_expires_at: datetime | None
    profile_id: int | None
    error: str | None = Field(description="why it failed, or why the last attempt did")
    created_at: datetime
    updated_at: datetime


class JobsPublic(Page[JobPublic]):
    pass


class JobQuery(PageQuery):
    """Filters of the job list; newest first."""

    status: JobStatus | None = None
    device: Reference | None = Field(default=None, description="the device the job asks for")


class Lease(BaseModel):
    lease_id: str
    lease_expires_at: datetime
    lease_seconds: float = Field(
        description="the lease's length: heartbeat well within it (a third is a good interval)"
    )


class JobClaim(BaseModel):
    """A claimed job and the lease under which its worker must heartbeat and report."""

    job: JobPublic
    lease: Lease


class LeaseRef(RequestModel):
    lease_id: LeaseId


class JobResult(LeaseRef):
    profile: ProfileCreate


class JobFailure(LeaseRef):
    reason: LongText = Field(min_length=1)
    retryable: StrictBool = Field(
        description="true when another attempt may succeed (a crash, a hang, a lost "
        "machine); false when the workload itself is wrong"
    )
