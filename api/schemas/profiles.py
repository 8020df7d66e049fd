"""Profiles: ``ProfileCreate`` is ``tuner.core.results.Profile`` (what ``tuner profile --json``
prints, less the recommendation keys it adds), with every value bounded to what the store
keeps. ``ProfilePublic`` adds the ids; list pages carry ``ProfileSummary`` (no probes)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import BaseModel, Field, model_validator

from api.schemas.common import (
    INT64_MAX,
    FiniteFloat,
    Int32,
    Int64,
    Key,
    LongText,
    LooseTimestamp,
    NonNegativeFloat,
    Page,
    PageQuery,
    PositiveInt32,
    Reference,
    Text32,
    Text100,
    Text200,
    Timestamp,
)
from api.schemas.devices import DeviceInfoCreate
from api.schemas.workloads import WorkloadInfoCreate
from tuner.core import results

SignedInt64 = Annotated[int, Field(ge=-INT64_MAX, le=INT64_MAX)]
# A workload option's value in a variant, as `-o name=value` gives it.
VariantValueCreate = Text200 | SignedInt64 | FiniteFloat | bool | None


class MemoryBreakdownCreate(results.MemoryBreakdown):
    parameters_bytes: Int64
    gradients_bytes: Int64
    optimizer_state_bytes: Int64
    # The peak less the resident parts: measurement noise can make it slightly negative.
    activations_bytes: SignedInt64
    allocator_cache_bytes: Int64 = 0
    communication_bytes: Int64 = 0
    collective_copies_bytes: Int64 = 0
    activations_by_block_bytes: dict[Text200, Int64] = Field(default_factory=dict, max_length=4096)


class ProbeCreate(results.ProbeResult):
    """``tuner.core.results.ProbeResult``, whose JSON may carry the derived ``peak_bytes``."""

    micro_batch_size: PositiveInt32
    peak_allocated_bytes: Int64 | None = None
    peak_reserved_bytes: Int64 | None = None
    non_torch_bytes: SignedInt64 = 0
    alloc_retries: Int32 = 0
    phase_peaks_bytes: dict[Text100, SignedInt64] = Field(default_factory=dict)
    breakdown: MemoryBreakdownCreate | None = None
    rank_peaks_bytes: list[Int64] = Field(default_factory=list)
    rank_breakdowns: list[MemoryBreakdownCreate] = Field(default_factory=list)  # type: ignore[assignment]
    step_time_s: NonNegativeFloat | None = None
    samples_per_second: NonNegativeFloat | None = None
    steps_run: Int32 = 0
    wall_time_s: NonNegativeFloat = 0.0
    error: LongText | None = None


class AffineFitCreate(results.AffineFit):
    fixed_bytes: FiniteFloat
    bytes_per_sample: FiniteFloat
    points: Int32


class ProbeSettingsCreate(results.ProbeSettings):
    warmup_steps: Int32 = 2
    measure_steps: PositiveInt32 = 1
    microbatches_per_step: PositiveInt32 = 2


class ProfileCreate(results.Profile):
    """A profile as the engine writes it; stored whole with its probes, or not at all."""

    variant: dict[Text100, VariantValueCreate] = Field(default_factory=dict, max_length=32)
    variant_group: Key | None = None

    workload_key: Key
    device_key: Key
    workload: WorkloadInfoCreate
    device: DeviceInfoCreate
    headroom: float = Field(ge=0, lt=1, allow_inf_nan=False)
    budget_bytes: Int64
    strategy: Text32 = Field(min_length=1)
    size_cap: PositiveInt32
    max_micro_batch_size: Int32 = Field(description="M*, the largest fitting size; 0 if none fits")
    probes: list[ProbeCreate]  # type: ignore[assignment]
    oversize_probe: ProbeCreate | None = None
    fit: AffineFitCreate | None
    settings: ProbeSettingsCreate
    wall_time_s: NonNegativeFloat
    created_at: Timestamp = Field(default_factory=lambda: datetime.now(UTC))

    world_size: PositiveInt32 = Field(default=1, description="ranks the probes ran on")

    @model_validator(mode="after")
    def _one_entry_per_rank(self) -> ProfileCreate:
        for probe in [*self.probes, *([self.oversize_probe] if self.oversize_probe else [])]:
            for name in ("rank_peaks_bytes", "rank_breakdowns"):
                count = len(getattr(probe, name))
                if count not in (0, self.world_size):
                    raise ValueError(
                        f"the probe at micro batch {probe.micro_batch_size} lists {count} "
                        f"{name} for world size {self.world_size}: give one per rank, or none"
                    )
        return self


class ProfilePublic(ProfileCreate):
    """A stored profile with its probes."""

    id: int
    workload_id: int
    device_id: int


class ProfileSummary(BaseModel):
    """A stored profile without its probes, as list pages show it."""

    id: int
    workload_id: int
    workload_key: str
    workload_name: str
    device_id: int
    device_key: str
    device_name: str
    created_at: datetime
    received_at: datetime | None = Field(
        default=None, description="when the service stored it: what orders the list"
    )
    max_micro_batch_size: int
    headroom: float
    budget_bytes: int
    strategy: str
    size_cap: int
    fit: results.AffineFit | None
    wall_time_s: float
    world_size: int = 1
    parallel_mode: str = "none"


class ProfilesPublic(Page[ProfileSummary]):
    pass


class ProfileQuery(PageQuery):
    """Filters of the profile list; newest first."""

    workload: Reference | None = Field(default=None, description="workload key or name")
    device: Reference | None = Field(default=None, description="device key or name")
    created_after: LooseTimestamp | None = Field(
        default=None, description="only profiles created after this time"
    )
    created_before: LooseTimestamp | None = Field(
        default=None, description="only profiles created before this time"
    )
