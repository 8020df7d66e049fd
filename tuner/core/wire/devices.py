"""Devices: a device key names what changes memory on it (kind, model, capacity)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from tuner.core import results
from tuner.core.wire.common import (
    FiniteFloat,
    Key,
    LongText,
    Name,
    Page,
    PageQuery,
    PositiveInt64,
    SignedInt64,
    Text16,
    Text200,
)

DetailValue = LongText | SignedInt64 | FiniteFloat | None


class DeviceInfoCreate(results.DeviceInfo):
    """``tuner.core.results.DeviceInfo`` bounded to what the store keeps."""

    kind: Text16 = Field(min_length=1)
    name: Name
    capacity_bytes: PositiveInt64
    details: dict[Text200, DetailValue] = Field(default_factory=dict)


class DeviceCreate(DeviceInfoCreate):
    """A device registered ahead of its first profile (a worker does this on start)."""

    key: Key


class DevicePublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    key: str
    kind: str
    name: str
    capacity_bytes: int
    details: dict[str, str | int | float | None]
    created_at: datetime


class DevicesPublic(Page[DevicePublic]):
    pass


class DeviceQuery(PageQuery):
    kind: Text16 | None = Field(default=None, description="cpu or cuda")
    name: Name | None = None
