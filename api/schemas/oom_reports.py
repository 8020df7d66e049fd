"""Out-of-memory reports from training: each lowers recommendations below its size."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from api.schemas.common import LongText, PositiveInt32, Reference, RequestModel


class OomReportCreate(RequestModel):
    workload: Reference = Field(description="workload key or name")
    device: Reference = Field(description="device key or name")
    micro_batch_size: PositiveInt32 = Field(description="the micro batch that ran out of memory")
    message: LongText | None = Field(default=None, description="the error, for people")


class OomReportPublic(BaseModel):
    id: int
    workload_id: int
    workload_key: str
    device_id: int
    device_key: str
    micro_batch_size: int
    message: str | None
    created_at: datetime
