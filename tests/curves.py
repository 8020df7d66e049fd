"""Synthetic memory curves: pure functions from micro batch size to a measured probe.

They stand in for a device in search tests. Nothing is mocked: a strategy sees only
``ProbeResult`` values, and these curves produce them the way a backend would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tuner.core.results import MemoryBreakdown, ProbeResult


@dataclass
class Curve:
    """A device whose footprint at ``m`` is ``footprint(m)``, compared with ``budget``.

    Above ``capacity`` (when given) a step runs out of memory before finishing, so the
    probe reports OOM and no peak, as a real backend does. ``resident`` is what probe
    breakdowns report as weights, gradients and optimizer state (``None``: no breakdown).
    With ``phases`` (name → allocated peak of that phase of a step), probes report each
    phase's peak, their maximum as the allocated peak, and ``footprint`` as the reserved
    peak, as the probe does. Every call is recorded in ``calls``.
    """

    footprint: Callable[[int], int]
    budget: int
    capacity: int | None = None
    resident: int | None = None
    phases: dict[str, Callable[[int], int]] | None = None
    calls: list[int] = field(default_factory=list)

    def fits(self, m: int) -> bool:
        return self.footprint(m) <= self.budget

    def __call__(self, m: int) -> ProbeResult:
        self.calls.append(m)
        peak = self.footprint(m)
        if self.capacity is not None and peak > self.capacity:
            return ProbeResult(micro_batch_size=m, fits=False, oom=True, steps_run=1)
        breakdown = None
        if self.resident is not None:
            resident = min(self.resident, peak)
            breakdown = MemoryBreakdown(
                parameters_bytes=resident // 4,
                gradients_bytes=resident // 4,
                optimizer_state_bytes=resident - 2 * (resident // 4),
                activations_bytes=peak - resident,
            )
        phase_peaks = {name: f(m) for name, f in (self.phases or {}).items()}
        return ProbeResult(
            micro_batch_size=m,
            fits=peak <= self.budget,
            peak_allocated_bytes=max(phase_peaks.values(), default=peak),
            peak_reserved_bytes=peak,
            phase_peaks_bytes=phase_peaks,
            breakdown=breakdown,
            steps_run=3,
        )

    def brute_force(self, cap: int) -> int:
        """M* by trying every size: the largest fitting size up to ``cap``, 0 if none."""
        return max((m for m in range(1, cap + 1) if self.fits(m)), default=0)


def affine(fixed: int, slope: int, granule: int = 1) -> Callable[[int], int]:
    """``fixed + slope·m`` rounded up to the allocator's ``granule``."""
    return lambda m: -(-(fixed + slope * m) // granule) * granule


def flat_then_affine(flat: int, fixed: int, slope: int) -> Callable[[int], int]:
    """``max(flat, fixed + slope·m)``: a workspace dominates small sizes."""
    return lambda m: max(flat, fixed + slope * m)


def steps(base: int, width: int, height: int) -> Callable[[int], int]:
    """Flat runs of ``width`` sizes, each ``height`` above the last (kernel choices)."""
    return lambda m: base + height * ((m - 1) // width)


def affine_with_jump(fixed: int, slope: int, at: int, jump: int) -> Callable[[int], int]:
    """An affine curve that jumps by ``jump`` from size ``at`` on (a larger algorithm)."""
    return lambda m: fixed + slope * m + (jump if m >= at else 0)


def kinked(resident: int) -> Callable[[int], int]:
    """The shape measured on small models: at size 1 the peak holds weight-sized
    temporaries (16 KiB here) that larger sizes hide, so the curve is the larger of two
    lines and the one through size 1 is flatter than the one that binds near ``M*``."""
    return lambda m: resident + max(16_648 + 1_160 * m, 2_608 + 1_456 * m)


def two_phases(
    accumulate: Callable[[int], int], optimizer: Callable[[int], int], granule: int = 1
) -> tuple[Callable[[int], int], dict[str, Callable[[int], int]]]:
    """A step whose peak is the larger of its forward/backward and optimizer phases; the
    reserved footprint rounds that up to the allocator's ``granule``."""
    phases = {"accumulate": accumulate, "optimizer": optimizer}
    return (lambda m: -(-max(accumulate(m), optimizer(m)) // granule) * granule), phases
