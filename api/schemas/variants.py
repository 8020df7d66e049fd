"""The variants of one exploration, compared: ``GET /api/v1/profiles/{id}/variants``."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from tuner.core.results import VariantValue


class VariantPublic(BaseModel):
    """One variant's profile: its options, M*, and what was measured at M*."""

    profile_id: int
    workload_key: str
    workload_name: str
    variant: dict[str, VariantValue]
    max_micro_batch_size: int
    peak_bytes: int | None
    samples_per_second: float | None
    created_at: datetime


class VariantsPublic(BaseModel):
    """The profiles sharing ``variant_group``, oldest first; one when not explored."""

    variant_group: str | None
    data: list[VariantPublic]
    count: int
