"""Profiles: ``ProfileCreate`` is ``tuner.core.results.Profile``, with every value bounded to
what the store keeps. ``POST /api/v1/profiles`` takes what ``tuner profile --json`` prints,
as printed: ``ProfileReportCreate`` (a profile and what the command adds beside it, which
is checked and not stored) or, for ``--seq-lens``, ``LengthsReportCreate`` (a profile per
length, stored together). ``ProfilePublic`` adds the ids; list pages carry
``ProfileSummary`` (no probes)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    Strict,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from tuner.core import reports, results, speeds, timeline
from tuner.core.errors import BadInputError
from tuner.core.parallel import Parallel
from tuner.core.shape import MeshShape
from tuner.core.wire.common import (
    FiniteFloat,
    Fraction,
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
    SignedInt64,
    StrictBool,
    Text32,
    Text64,
    Text100,
    Text200,
    Timestamp,
)
from tuner.core.wire.devices import DeviceInfoCreate
from tuner.core.wire.workloads import WorkloadInfoCreate

# An operator's name in a timeline (``aten.mm``, or on CUDA the allocating Python frame):
# at most timeline.MAX_OPERATOR_NAME (64) characters.
OperatorName = Text64
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


class PhaseSpanCreate(timeline.PhaseSpan):
    micro_batch: Int32 | None = None
    start: Int64
    end: Int64


class MemoryTimelineCreate(timeline.MemoryTimeline):
    """A probe's timeline, bounded (``tuner.core.timeline``): at most MAX_TIMELINE_POINTS
    points and MAX_TIMELINE_OPERATORS names, so at most MAX_TIMELINE_JSON_BYTES as JSON."""

    length: Int64
    samples: Int64
    position: list[Int64] = Field(max_length=timeline.MAX_TIMELINE_POINTS)
    live_bytes: list[Int64] = Field(max_length=timeline.MAX_TIMELINE_POINTS)
    operator: list[Int32] = Field(max_length=timeline.MAX_TIMELINE_POINTS)
    operators: list[OperatorName] = Field(max_length=timeline.MAX_TIMELINE_OPERATORS)
    phases: list[PhaseSpanCreate] = Field(  # type: ignore[assignment]
        default_factory=list, max_length=timeline.MAX_TIMELINE_PHASES
    )
    peak_bytes: Int64


class ProbeCreate(results.ProbeResult):
    """``tuner.core.results.ProbeResult``, whose JSON may carry the derived ``peak_bytes``."""

    micro_batch_size: PositiveInt32
    fits: StrictBool
    oom: StrictBool = False
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
    timeline: MemoryTimelineCreate | None = None


class AffineFitCreate(results.AffineFit):
    fixed_bytes: FiniteFloat
    bytes_per_sample: FiniteFloat
    points: Int32


class ProbeSettingsCreate(results.ProbeSettings):
    warmup_steps: Int32 = 2
    measure_steps: PositiveInt32 = 1
    microbatches_per_step: PositiveInt32 = 2
    simulated_ranks: StrictBool = False


class TimedSizeCreate(speeds.TimedSize):
    micro_batch_size: PositiveInt32
    seconds_per_sample: list[NonNegativeFloat] = Field(min_length=1, max_length=speeds.MAX_ROUNDS)


class SpeedCurveCreate(speeds.SpeedCurve):
    sizes: list[TimedSizeCreate] = Field(  # type: ignore[assignment]
        min_length=1, max_length=speeds.MAX_TIMED_SIZES
    )
    optimizer_seconds: NonNegativeFloat
    per_rank_batch_size: PositiveInt32 | None = None


class ParallelCreate(Parallel):
    """``tuner.core.parallel.Parallel`` with strict numbers and flags."""

    gradient_as_bucket_view: StrictBool = True
    bucket_cap_mb: Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)] = 25.0
    static_graph: StrictBool = False
    set_to_none: StrictBool | None = None
    reshard_after_forward: StrictBool = True
    tp: PositiveInt32 = 1
    sequence_parallel: StrictBool = False


class ProfileCreate(results.Profile):
    """A profile as the engine writes it; stored whole with its probes, or not at all."""

    variant: dict[Text100, VariantValueCreate] = Field(default_factory=dict, max_length=32)
    variant_group: Key | None = None
    variant_chosen: StrictBool = False

    workload_key: Key
    device_key: Key
    workload: WorkloadInfoCreate
    device: DeviceInfoCreate
    headroom: Fraction
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
    parallel: ParallelCreate = Field(default_factory=ParallelCreate)
    speeds: SpeedCurveCreate | None = None

    @model_validator(mode="after")
    def _one_entry_per_rank(self) -> ProfileCreate:
        # A simulated world (one process standing for rank 0, --fake-world) measured one.
        ranks = 1 if self.settings.simulated_ranks else self.world_size
        for probe in [*self.probes, *([self.oversize_probe] if self.oversize_probe else [])]:
            for name in ("rank_peaks_bytes", "rank_breakdowns"):
                count = len(getattr(probe, name))
                if count not in (0, ranks):
                    raise ValueError(
                        f"the probe at micro batch {probe.micro_batch_size} lists {count} "
                        f"{name} for world size {self.world_size}: give one per rank, or none"
                    )
        return self

    @model_validator(mode="after")
    def _ranks_are_a_mesh(self) -> ProfileCreate:
        # A profile whose tp does not divide its world size (or exceeds it) describes no
        # run: stored, every question fitting across its shapes would divide by nothing.
        try:
            MeshShape(self.world_size, self.parallel.tp)
        except BadInputError as exc:
            error = InitErrorDetails(
                type=PydanticCustomError("not_a_mesh", "{problem}", {"problem": exc.message}),
                loc=("parallel", "tp"),
                input=self.parallel.tp,
            )
            raise ValidationError.from_exception_data(type(self).__name__, [error]) from None
        return self

    @model_validator(mode="after")
    def _chosen_among_variants(self) -> ProfileCreate:
        if self.variant_chosen and self.variant_group is None:
            raise ValueError(
                "variant_chosen is true but the profile has no variant_group: only a variant "
                "of an exploration is chosen; give its group, or leave variant_chosen out"
            )
        return self

    @model_validator(mode="after")
    def _answer_is_measured(self) -> ProfileCreate:
        problem = self.unmeasured_answer()
        if problem is not None:
            # Located at the field, so that the 422 names it.
            error = InitErrorDetails(
                type=PydanticCustomError("unmeasured_answer", "{problem}", {"problem": problem}),
                loc=("max_micro_batch_size",),
                input=self.max_micro_batch_size,
            )
            raise ValidationError.from_exception_data(type(self).__name__, [error])
        return self


class ProfileReportCreate(ProfileCreate, reports.ProfileReport):
    """What ``tuner profile --json`` prints: the profile, with the fields the command adds
    (``reports.ADDED_FIELDS``) checked against it and then dropped, never stored."""

    advice: list[LongText] | None = Field(default=None, max_length=64)

    def create(self) -> ProfileCreate:
        """The profile alone, as the store keeps it."""
        return ProfileCreate.model_validate(
            self.model_dump(include=set(ProfileCreate.model_fields))
        )


class LengthsReportCreate(reports.LengthsReport):
    """What ``tuner profile --seq-lens … --json`` prints: a profile per length."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    length_family: Key | None
    seq_lens: list[PositiveInt32] = Field(max_length=64)
    profiles: list[ProfileReportCreate] = Field(min_length=1, max_length=64)  # type: ignore[assignment]


def _printed(document: Any) -> ProfileReportCreate | LengthsReportCreate:
    # A --seq-lens document is the only one with a list of profiles. Chosen by that, not
    # by trying both, so a bad profile's errors are those of the profile schema alone,
    # located as FastAPI locates them (body.probes.0...).
    if isinstance(document, ProfileReportCreate | LengthsReportCreate):
        return document
    if isinstance(document, dict) and "profiles" in document:
        return LengthsReportCreate.model_validate(document)
    return ProfileReportCreate.model_validate(document)


PrintedProfile = Annotated[
    ProfileReportCreate | LengthsReportCreate,
    PlainValidator(_printed, json_schema_input_type=ProfileReportCreate | LengthsReportCreate),
]


class ProfilePublic(ProfileCreate):
    """A stored profile with its probes."""

    @model_validator(mode="after")
    def _answer_is_measured(self) -> ProfilePublic:
        # Shown as stored: profiles stored before the rule was enforced are still read.
        return self

    id: int
    workload_id: int
    device_id: int


class ProfilesCreated(BaseModel):
    """The profiles of a ``--seq-lens`` document, stored, in its order."""

    data: list[ProfilePublic]
    count: int


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
