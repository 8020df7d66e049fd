"""Answers for a world size never measured, from profiles at two or more others.

Per rank, peak memory is close to

    peak(m, W) ≈ a + b·m + s / W

``a`` is what every rank holds whole (DDP's replicas, buffers, workspaces), ``b`` the
activations per sample (the same on every rank), ``s`` what FSDP shards over the ranks
(parameters, gradients, optimizer state). Measured on the CPU, peaks at m = 1 fall like
``a + s / W`` to within a fraction of a percent. A step has two phases whose peaks grow
differently (forward and backward with m; the optimizer step hardly at all), so each is
fitted on its own by least squares over every probe whose peak was measured, at every
world size given, and the peak is the larger of the two.

Only probes near each profile's boundary (half to twice its M*) enter the fit: that is
where the answer lies, and at small sizes a fixed transient can hold a phase's peak flat.

The answer is ``estimated``: the largest m whose predicted footprint, raised by the fit's
largest relative residual, stays within the budget, and never above what was measured to
fit at the nearest measured world size at or above W (memory per rank does not grow with
W, so that size is a ceiling that ran). Torch-free, so the service can answer with it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from tuner.core.errors import BadInputError
from tuner.core.least_squares import fit_linear, relative_weights
from tuner.core.plan import Basis
from tuner.core.results import Profile


class PhaseFit(BaseModel):
    """``peak(m, W) ≈ fixed + per_sample·m + sharded / W`` for one phase of a step."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fixed_bytes: float
    per_sample_bytes: float
    sharded_bytes: float

    def predict(self, micro_batch_size: int, world_size: int) -> float:
        return (
            self.fixed_bytes
            + self.per_sample_bytes * micro_batch_size
            + self.sharded_bytes / world_size
        )


class WorldFit(BaseModel):
    """One fit per phase of a step (forward and backward of the micro batches grow with m;
    the optimizer step does not): the peak is the larger of the phases, plus what the
    allocator caches and memory outside torch at the nearest measured size."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    phases: dict[str, PhaseFit]
    overhead_bytes: float
    points: int
    world_sizes: list[int]
    max_relative_error: float

    def predict(self, micro_batch_size: int, world_size: int) -> float:
        peak = max(fit.predict(micro_batch_size, world_size) for fit in self.phases.values())
        return peak + self.overhead_bytes

    @property
    def per_sample_bytes(self) -> float:
        return max(fit.per_sample_bytes for fit in self.phases.values())


class WorldEstimate(BaseModel):
    """The largest micro batch expected to fit at ``world_size``, and what it rests on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    world_size: int
    max_micro_batch_size: int
    expected_peak_bytes: int
    fit: WorldFit
    based_on: list[int]  # the world sizes of the profiles used
    basis: Basis = "estimated"

    def describe(self) -> str:
        if self.basis == "measured":
            return f"M* {self.max_micro_batch_size} at world size {self.world_size} (measured)"
        return (
            f"M* {self.max_micro_batch_size} at world size {self.world_size} (estimated from "
            f"world sizes {', '.join(map(str, self.based_on))}; fit within "
            f"{self.fit.max_relative_error:.1%} of every measured peak)"
        )


def fit_world_sizes(profiles: Sequence[Profile]) -> WorldFit:
    """Least squares of each phase's measured peak against ``(1, m, 1/W)``."""
    _check_comparable(profiles)
    # Near each profile's boundary only: at small sizes a fixed transient (an all-gathered
    # embedding, say) can hold the peak flat, and far past the budget nothing is decided.
    measured = [
        (probe, profile.world_size)
        for profile in profiles
        for probe in profile.probes
        if probe.footprint_bytes is not None
        and probe.peak_allocated_bytes is not None
        and near_boundary(probe.micro_batch_size, profile.max_micro_batch_size)
    ]
    if len({probe.micro_batch_size for probe, _ in measured}) < 2:
        raise BadInputError("the profiles measured fewer than two micro batch sizes: profile more")
    curves: dict[str, list[tuple[int, int, int]]] = {}
    for probe, world in measured:
        # Without phases (an older profile), the whole footprint is one curve.
        peaks = probe.phase_peaks_bytes or {"step": probe.peak_allocated_bytes or 0}
        for phase, peak in peaks.items():
            curves.setdefault(phase, []).append((probe.micro_batch_size, world, peak))
    overhead = max(
        (probe.footprint_bytes or 0) - (probe.peak_allocated_bytes or 0) for probe, _ in measured
    )
    fit = WorldFit(
        phases={phase: _fit_phase(points) for phase, points in curves.items()},
        overhead_bytes=float(overhead),
        points=len(measured),
        world_sizes=sorted({p.world_size for p in profiles}),
        max_relative_error=0.0,
    )
    worst = max(
        abs(fit.predict(probe.micro_batch_size, world) - (probe.footprint_bytes or 0))
        / (probe.footprint_bytes or 1)
        for probe, world in measured
    )
    return fit.model_copy(update={"max_relative_error": worst})


def near_boundary(size: int, max_micro_batch_size: int) -> bool:
    """Within a factor of two of ``M*``: the probes a fit should answer near the boundary from."""
    return max_micro_batch_size / 2 <= size <= 2 * max_micro_batch_size + 2


def _fit_phase(points: list[tuple[int, int, int]]) -> PhaseFit:
    """Least squares of relative errors over ``(m, W, peak)`` points."""
    rows = [(1.0, float(m), 1.0 / w) for m, w, _ in points]
    peaks = [float(peak) for _, _, peak in points]
    a, b, s = fit_linear(rows, peaks, relative_weights(peaks))
    return PhaseFit(fixed_bytes=a, per_sample_bytes=b, sharded_bytes=s)


def estimate_world_size(profiles: Sequence[Profile], world_size: int) -> WorldEstimate:
    """The answer for ``world_size`` from profiles of the same workload at other sizes."""
    if world_size < 1:
        raise BadInputError(f"world size must be at least 1, got {world_size}")
    fit = fit_world_sizes(profiles)
    exact = [p for p in profiles if p.world_size == world_size]
    if exact:  # measured: the newest profile at this size answers
        found = max(exact, key=lambda p: p.created_at)
        probe = found.probe_at(found.max_micro_batch_size)
        return WorldEstimate(
            world_size=world_size,
            max_micro_batch_size=found.max_micro_batch_size,
            expected_peak_bytes=(probe.footprint_bytes or 0) if probe else 0,
            fit=fit,
            based_on=[world_size],
            basis="measured",
        )
    if fit.per_sample_bytes <= 0:
        raise BadInputError("peak memory does not grow with the micro batch in these profiles")
    budget = profiles[0].budget_bytes
    margin = 1 + fit.max_relative_error
    fitting = [
        m
        for m in range(1, profiles[0].size_cap + 1)
        if fit.predict(m, world_size) * margin <= budget
    ]
    size = max(fitting, default=0)
    at_or_above = [p for p in profiles if p.world_size >= world_size]
    ceiling_from = (
        min(at_or_above, key=lambda p: p.world_size)
        if at_or_above
        else max(profiles, key=lambda p: p.world_size)
    )
    size = max(0, min(size, ceiling_from.max_micro_batch_size, profiles[0].size_cap))
    return WorldEstimate(
        world_size=world_size,
        max_micro_batch_size=size,
        expected_peak_bytes=int(fit.predict(size, world_size)) if size else 0,
        fit=fit,
        based_on=fit.world_sizes,
    )


def _check_comparable(profiles: Sequence[Profile]) -> None:
    if len({p.world_size for p in profiles}) < 2:
        raise BadInputError(
            "an estimate across world sizes needs profiles at two or more world sizes"
        )
    first = profiles[0]
    for profile in profiles[1:]:
        if (profile.parallel.memory_fields(), profile.budget_bytes, profile.device_key) != (
            first.parallel.memory_fields(),
            first.budget_bytes,
            first.device_key,
        ):
            raise BadInputError(
                "the profiles differ in parallel mode, options, device or budget: estimate "
                "from profiles of one workload, one device and one parallel setting"
            )
        if profile.workload_key != first.workload_key:
            raise BadInputError("the profiles are of different workloads")
