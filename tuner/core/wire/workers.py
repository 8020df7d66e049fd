"""Workers: processes on GPU hosts that claim jobs for their device."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from tuner.core.wire.common import IdempotencyKey, Key, Name, RequestModel
from tuner.core.wire.devices import DeviceInfoCreate


class WorkerCreate(RequestModel):
    name: Name = Field(examples=["gpu-host-3"])
    device_key: Key = Field(description="the device key tuner.engine.fingerprint computed there")
    device: DeviceInfoCreate
    idempotency_key: IdempotencyKey | None = Field(
        default=None, description="one key per registration (the worker sends one)"
    )


class WorkerPublic(BaseModel):
    id: int
    name: str
    device_key: str
    device_name: str
    registered_at: datetime
    last_heartbeat_at: datetime
    left_at: datetime | None = Field(
        default=None, description="when it said it stops on purpose; null while it runs"
    )


class WorkersPublic(BaseModel):
    data: list[WorkerPublic]
    count: int
