"""What a profile is: probes, the affine fit and the answer. Torch-free, so the service,
the client and the engine share one schema."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

from tuner.core.least_squares import fit_linear
from tuner.core.parallel import Parallel
from tuner.core.phases import PeakPhase
from tuner.core.shape import MeshShape
from tuner.core.speeds import SpeedCurve
from tuner.core.timeline import MemoryTimeline

# A workload option's value, as `-o name=value` parses it.
VariantValue = str | int | float | bool | None
# The name under which activations saved outside every top-level block are counted.
OUTSIDE_BLOCKS = "(outside blocks)"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MemoryBreakdown(_Frozen):
    """Where the peak went, on one rank. ``activations_bytes`` is the peak less the resident
    parts, so it holds activations and every temporary alive at the peak (FSDP's
    all-gathered parameters among them). Under FSDP parameters, gradients and optimizer
    state are this rank's shards; under DDP they are whole.

    ``communication_bytes`` is what the parallel wrapper keeps between micro batches: DDP's
    bucket copy of the gradients (none when gradients are bucket views zeroed in place), or
    FSDP's unsharded gradients held for accumulation when it syncs on the last micro batch.

    ``activations_by_block_bytes`` and ``peak_phase`` say where the peak is: which block's
    saved activations weigh most, and whether the peak falls in forward, backward or the
    optimizer step (then activations are gone and optimizer temporaries are the peak).
    """

    parameters_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    activations_bytes: int
    allocator_cache_bytes: int = 0
    communication_bytes: int = 0
    collective_copies_bytes: int = Field(
        default=0,
        ge=0,
        description="on CPU ranks (gloo): what the process held at its peak beyond this "
        "peak, every allocation and free of every thread counted (gloo's all-gather "
        "temporaries on its worker threads, and the output-sized buffer it allocates on the "
        "step's thread inside _allgather_base_ and reduce_scatter_tensor_coalesced_); "
        "a GPU with NCCL holds none of it. In a fake world: the largest buffer of one "
        "collective, held a moment longer at the peak as a real one may be. 0 elsewhere",
    )
    activations_by_block_bytes: dict[str, int] = Field(
        default_factory=dict,
        description="bytes saved for backward by each top-level block at the end of forward "
        f"(what backward starts from), in model order; {OUTSIDE_BLOCKS!r} holds what the "
        "loss and the code between blocks saved. Empty where not measured",
    )
    peak_phase: PeakPhase | None = Field(
        default=None, description="the phase of the step in which the peak fell"
    )

    @property
    def resident_bytes(self) -> int:
        """Bytes that do not depend on the micro batch size."""
        return (
            self.parameters_bytes
            + self.gradients_bytes
            + self.optimizer_state_bytes
            + self.communication_bytes
        )


class ProbeResult(_Frozen):
    """One measured training step at ``micro_batch_size``.

    ``peak_bytes`` is the reserved peak (what the process held); ``footprint_bytes`` adds
    memory outside torch (CUDA context, other processes) and, on the CPU under gloo, the
    collective copies, and is what the budget is compared with. Peaks are ``None`` when
    the step ran out of memory before finishing.

    ``collective_copies_bytes`` (the breakdown's, the largest over ranks): on CPU ranks
    (gloo), what the process held beyond ``peak_bytes``. A GPU with NCCL holds none of it,
    so ``peak_bytes`` leaves it out and stands for a GPU; the CPU limit is checked with it.
    """

    micro_batch_size: int = Field(ge=1)
    fits: bool
    oom: bool = False
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    non_torch_bytes: int = 0
    alloc_retries: int = 0
    phase_peaks_bytes: dict[str, int] = Field(
        default_factory=dict,
        description="allocated peak of each phase of a step: 'accumulate' (forward and "
        "backward of every micro batch) and 'optimizer' (the optimizer step)",
    )
    breakdown: MemoryBreakdown | None = None
    rank_peaks_bytes: list[int] = Field(
        default_factory=list,
        description="at a world size: each rank's reserved peak (peak_bytes is the largest)",
    )
    rank_breakdowns: list[MemoryBreakdown] = Field(
        default_factory=list, description="at a world size: each rank's breakdown"
    )
    step_time_s: float | None = None
    samples_per_second: float | None = None
    steps_run: int = 0
    wall_time_s: float = 0.0
    error: str | None = None
    timeline: MemoryTimeline | None = Field(
        default=None,
        description="live bytes over the measured step, operator by operator, with its "
        "phases and peak: kept for the probe at M* (tuner.core.timeline)",
    )

    @model_validator(mode="before")
    @classmethod
    def _accept_own_json(cls, data: Any) -> Any:
        # peak_bytes is derived and printed in the JSON; reading that JSON back must work.
        if isinstance(data, dict) and "peak_bytes" in data:
            return {key: value for key, value in data.items() if key != "peak_bytes"}
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def peak_bytes(self) -> int | None:
        return self.peak_reserved_bytes

    @property
    def footprint_bytes(self) -> int | None:
        if self.peak_reserved_bytes is None:
            return None
        return self.peak_reserved_bytes + self.non_torch_bytes + self.collective_copies_bytes

    @property
    def collective_copies_bytes(self) -> int:
        return self.breakdown.collective_copies_bytes if self.breakdown is not None else 0


class AffineFit(_Frozen):
    """Least-squares line through measured peaks: ``footprint(m) ≈ fixed + slope·m``.

    ``fixed`` is weights, gradients, optimizer state and workspaces; the slope is
    activations per sample. It aims the search and estimates other devices; the answer
    itself is always a probe that ran.
    """

    fixed_bytes: float
    bytes_per_sample: float
    points: int

    def predict(self, micro_batch_size: int) -> float:
        return self.fixed_bytes + self.bytes_per_sample * micro_batch_size

    def largest_fitting(self, budget_bytes: float) -> int:
        """Largest m with ``fixed + slope·m ≤ budget``, ``⌊(budget − fixed) / slope⌋`` or 0."""
        if self.bytes_per_sample <= 0:
            raise ValueError("a fit with a non-positive slope cannot predict a largest size")
        return max(0, int((budget_bytes - self.fixed_bytes) // self.bytes_per_sample))

    @classmethod
    def through(cls, points: Sequence[tuple[int, int]]) -> AffineFit | None:
        """Fit ``(micro_batch_size, footprint_bytes)`` points; ``None`` below two distinct sizes.

        Ordinary least squares (:func:`tuner.core.least_squares.fit_linear`, equal weights)
        over the sizes centred on their mean ``m̄``, ``footprint ≈ level + slope·(m − m̄)``,
        which keeps the normal equations well conditioned; ``fixed = level − slope·m̄``.
        """
        sizes = {m for m, _ in points}
        if len(sizes) < 2:
            return None
        n = len(points)
        mean_m = sum(m for m, _ in points) / n
        level, slope = fit_linear(
            [(1.0, m - mean_m) for m, _ in points], [y for _, y in points], [1.0] * n
        )
        return cls(fixed_bytes=level - slope * mean_m, bytes_per_sample=slope, points=n)


class WorkloadInfo(_Frozen):
    name: str
    target: str | None = None
    precision: str
    activation_checkpointing: bool
    parameter_count: int
    optimizer: str
    seq_len: int | None = Field(
        default=None,
        ge=1,
        description="the sequence length every sample has, when the workload was built "
        "for one (part of the workload key through the input shapes)",
    )
    length_family: str | None = Field(
        default=None,
        description="shared by the workloads that differ only in sequence length: the "
        "key of that family, which answers for lengths between and near the measured ones",
    )


class DeviceInfo(_Frozen):
    kind: str
    name: str
    capacity_bytes: int
    details: dict[str, str | int | float | None] = Field(default_factory=dict)


class ProbeSettings(_Frozen):
    """How each probe runs. Two warm-up steps create optimizer state, workspaces and caches;
    two micro batches per step keep gradients resident while the second one runs forward,
    as they are during gradient accumulation."""

    warmup_steps: int = Field(default=2, ge=0)
    measure_steps: int = Field(default=1, ge=1)
    microbatches_per_step: int = Field(default=2, ge=1)
    simulated_ranks: bool = Field(
        default=False,
        description="one process stood for rank 0 of the world on torch's fake process "
        "group: memory measured, numerics not trained",
    )


class Profile(_Frozen):
    """The outcome of a search: every probe that ran and the largest size that fit."""

    workload_key: str
    device_key: str
    workload: WorkloadInfo
    device: DeviceInfo
    headroom: float
    budget_bytes: int
    strategy: str
    size_cap: int
    max_micro_batch_size: int = Field(description="M*, the largest fitting size; 0 if none fits")
    probes: list[ProbeResult]
    oversize_probe: ProbeResult | None = Field(
        default=None,
        description="when nothing fits: size 1 measured whole past the capacity (CPU only)",
    )
    fit: AffineFit | None
    settings: ProbeSettings
    world_size: int = Field(default=1, ge=1, description="ranks the probes ran on")
    parallel: Parallel = Field(default_factory=Parallel)
    variant: dict[str, VariantValue] = Field(
        default_factory=dict,
        description="the workload options this profile measured, when it is one of the "
        "variants of an explored workload (checkpointing, precision, ...)",
    )
    variant_group: str | None = Field(
        default=None,
        description="shared by the profiles of one exploration: the variants to compare",
    )
    variant_chosen: bool = Field(
        default=False,
        description="the variant its exploration chose: the fastest measured plan for the "
        "global batch (without one, the fastest at its own M*)",
    )
    speeds: SpeedCurve | None = Field(
        default=None,
        description="micro batches timed at a few sizes after M* was found, as training "
        "runs them (tuner.core.speeds): what the answer compares splits by. None where "
        "not timed (ranks, a fake world, --no-time-plans, profiles stored before)",
    )
    wall_time_s: float
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @property
    def steps_run(self) -> int:
        return sum(p.steps_run for p in self.probes)

    @property
    def mesh(self) -> MeshShape:
        """The ranks the probes ran on, as ``dp × tp`` (the wire keeps ``world_size`` and
        ``parallel.tp``)."""
        return self.parallel.mesh(self.world_size)

    def probe_at(self, micro_batch_size: int) -> ProbeResult | None:
        """The last probe that ran at this size."""
        found = [p for p in self.probes if p.micro_batch_size == micro_batch_size]
        return found[-1] if found else None

    def unmeasured_answer(self) -> str | None:
        """Why ``max_micro_batch_size`` is not what the probes measured; ``None`` when it is.

        The answer is a probe that ran, never a prediction: ``M* = m ≥ 1`` needs a probe at
        ``m`` that fit, and one at ``m + 1`` that did not, unless ``m`` is the cap
        (``size_cap``, ``--max``); ``M* = 0`` (nothing fits) needs a probe at size 1 that
        did not fit.
        """
        found, cap = self.max_micro_batch_size, self.size_cap
        where = f"max_micro_batch_size {found}"
        if found > cap:
            return f"{where} is above the profile's size_cap {cap}: no search goes past its cap"
        if found >= 1:
            at = self.probe_at(found)
            if at is None or not at.fits:
                state = "no probe ran" if at is None else "the probe there did not fit"
                return f"{where} is not a size that fit ({state}): M* must be a probe that fit"
        if found < cap:
            above = self.probe_at(found + 1)
            if above is None or above.fits:
                state = "no probe ran there" if above is None else "it fit"
                return (
                    f"{where} is not the boundary: size {found + 1} must have been probed and "
                    f"not fit, but {state}; send M* as the largest size that fit, with the "
                    "probe above it that did not"
                )
        return None
