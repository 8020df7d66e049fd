"""Workloads: a workload key names what changes memory (model, inputs, optimizer, precision)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from tuner.core import results
from tuner.core.wire.common import (
    Int64,
    Key,
    Name,
    Page,
    PageQuery,
    PositiveInt32,
    StrictBool,
    Text8,
    Text100,
    Text500,
)


class WorkloadInfoCreate(results.WorkloadInfo):
    """``tuner.core.results.WorkloadInfo`` bounded to what the store keeps."""

    name: Name
    target: Text500 | None = None
    precision: Text8 = Field(min_length=1)
    activation_checkpointing: StrictBool
    parameter_count: Int64
    optimizer: Text100 = Field(min_length=1)
    seq_len: PositiveInt32 | None = Field(
        default=None, description="the sequence length every sample has, if built for one"
    )


class WorkloadCreate(WorkloadInfoCreate):
    """A workload registered ahead of its first profile."""

    key: Key


class WorkloadPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    key: str
    name: str
    target: str | None
    precision: str
    activation_checkpointing: bool
    parameter_count: int
    optimizer: str
    created_at: datetime


class WorkloadsPublic(Page[WorkloadPublic]):
    pass


class WorkloadQuery(PageQuery):
    name: Name | None = None
