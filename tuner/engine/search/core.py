"""What every strategy shares: the probe callback, the record of probes, the bracket."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tuner.core.results import ProbeResult

ProbeFn = Callable[[int], ProbeResult]
# A predicted probe of a size (a dry run, tuner.engine.dry_run), or None where none can be made.
PredictFn = Callable[[int], ProbeResult | None]


@dataclass(frozen=True)
class SearchOutcome:
    max_micro_batch_size: int  # 0 when nothing fits
    probes: list[ProbeResult]


@dataclass
class SearchRecorder:
    """Runs probes through ``probe``, never the same size twice, and keeps the bracket:
    ``lo`` is the largest size seen to fit (0: none yet), ``hi`` the smallest seen to fail
    (``cap + 1`` while none has)."""

    probe: ProbeFn
    cap: int
    probes: list[ProbeResult] = field(default_factory=list)
    by_size: dict[int, ProbeResult] = field(default_factory=dict)
    lo: int = 0
    hi: int = 0

    def __post_init__(self) -> None:
        if self.cap < 1:
            raise ValueError("the size cap must be at least 1")
        self.hi = self.cap + 1

    def run(self, size: int) -> ProbeResult:
        known = self.by_size.get(size)
        if known is not None:
            return known
        if not 1 <= size <= self.cap:
            raise ValueError(f"size {size} is outside [1, {self.cap}]")
        result = self.probe(size)
        self.probes.append(result)
        self.by_size[size] = result
        if result.fits:
            self.lo = max(self.lo, size)
        else:
            self.hi = min(self.hi, size)
        return result

    @property
    def settled(self) -> bool:
        """True once the boundary is pinned: nothing lies between a fit and a failure."""
        return self.hi - self.lo <= 1

    def outcome(self) -> SearchOutcome:
        return SearchOutcome(self.lo, list(self.probes))
