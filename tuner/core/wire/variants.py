"""The variants of one exploration, compared: ``GET /api/v1/profiles/{id}/variants``."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from tuner.core.plan import Run
from tuner.core.results import VariantValue


class VariantPlan(BaseModel):
    """A variant's plan for the exploration's global batch and its timed speed."""

    global_batch_size: int
    split: list[Run]
    grad_accum: int
    samples_per_second: float | None = Field(description="per rank, the curve's for the step")
    speed_spread: float | None = Field(description="of the timed rounds, a fraction")


class VariantPublic(BaseModel):
    """One variant's profile: its options, M*, and what was measured at M*."""

    profile_id: int
    workload_key: str
    workload_name: str
    variant: dict[str, VariantValue]
    max_micro_batch_size: int
    peak_bytes: int | None
    samples_per_second: float | None
    chosen: bool = Field(
        default=False,
        description="the variant the exploration chose: its plan for the global batch "
        "measured fastest (unmarked in explorations stored before the choice was kept)",
    )
    plan: VariantPlan | None = Field(
        default=None,
        description="its answer for the batch its exploration was timed for, from its "
        "speed curve: what the choice compared (None where the profile kept no curve)",
    )
    created_at: datetime


class VariantsPublic(BaseModel):
    """The profiles sharing ``variant_group``, oldest first; one when not explored."""

    variant_group: str | None
    data: list[VariantPublic]
    count: int
