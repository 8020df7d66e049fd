"""Out-of-memory reports from training: each lowers recommendations below its size."""

from __future__ import annotations

from datetime import datetime
from typing import Self

from pydantic import BaseModel, Field, model_validator

from tuner.core.wire.common import (
    Id,
    IdempotencyKey,
    LongText,
    PositiveInt32,
    Reference,
    RequestModel,
)


class OomReportCreate(RequestModel):
    workload: Reference = Field(description="workload key or name")
    device: Reference = Field(description="device key or name")
    micro_batch_size: PositiveInt32 = Field(description="the micro batch that ran out of memory")
    settled_micro_batch_size: PositiveInt32 | None = Field(
        default=None,
        description="the smaller micro batch the run went on with; answers stay at or "
        "below it (without it, one below the failed size)",
    )
    profile_id: Id | None = Field(
        default=None,
        description="the profile the plan that ran out of memory came from (a "
        "recommendation's profile_id): the report caps that profile's workload, whatever "
        "its name means later; workload must name it",
    )
    idempotency_key: IdempotencyKey | None = Field(
        default=None,
        description="one key per out-of-memory event, chosen by the reporter (a UUID): a "
        "retry with the same key and report returns the stored report instead of adding "
        "another; keys belong to the token that sends them",
    )
    message: LongText | None = Field(default=None, description="the error, for people")

    @model_validator(mode="after")
    def _settled_below_failed(self) -> Self:
        settled = self.settled_micro_batch_size
        if settled is not None and settled >= self.micro_batch_size:
            raise ValueError(
                f"settled_micro_batch_size {settled} must be below the failed "
                f"micro_batch_size {self.micro_batch_size}"
            )
        return self


class OomReportPublic(BaseModel):
    id: int
    workload_id: int
    workload_key: str
    device_id: int
    device_key: str
    micro_batch_size: int
    settled_micro_batch_size: int | None = None
    profile_id: int | None = None
    idempotency_key: str | None = None
    message: str | None
    created_at: datetime
