"""Our two strategies: ``bisect`` (double, then bisect) and ``model`` (aim with an affine fit)."""

from __future__ import annotations

from collections.abc import Callable

from tuner.core.errors import BadInputError
from tuner.engine.search.core import ProbeFn, SearchOutcome, SearchRecorder


def bisect_search(probe: ProbeFn, *, cap: int, budget_bytes: int) -> SearchOutcome:
    """Double from 1 until a probe fails (or the cap fits), then bisect the bracket."""
    del budget_bytes  # bisection needs only the verdicts
    search = SearchRecorder(probe, cap)
    size = 1
    while search.run(size).fits and size < cap:
        size = min(2 * size, cap)
    while not search.settled:
        search.run((search.lo + search.hi) // 2)
    return search.outcome()


def model_search(probe: ProbeFn, *, cap: int, budget_bytes: int) -> SearchOutcome:
    """Aim at the predicted ``M*`` and confirm the boundary with probes.

    Peak memory is close to affine in the micro batch size, ``peak(m) ≈ a + b·m``, so
    ``M* ≈ ⌊(budget − a) / b⌋``. A step has two phases whose peaks grow differently: the
    forward and backward of the micro batches (activations: steep) and the optimizer step
    (weight-sized temporaries: nearly flat). The peak is the larger of the two, so each is
    fitted on its own and ``M*`` is the smallest of their predictions.

    The first aim comes from probe 1 alone: the forward/backward peak less the resident
    weights, gradients and optimizer state is taken as the per-sample slope. That
    over-states it (weight-sized temporaries count too), so the aim lands low and safe.
    Later aims take, per phase, the secant through the measured peaks nearest the
    boundary. Aims stay strictly inside the bracket, so every probe narrows it. A
    bisection step replaces the aim when no slope is known, when a failed probe
    contradicts the prediction, or when aims have twice running failed to halve the
    bracket (doubling while no size has failed yet). The search ends when ``M*`` fits and
    ``M* + 1`` does not.
    """
    search = SearchRecorder(probe, cap)
    if not search.run(1).fits or cap == 1:
        return search.outcome()
    slow_aims = 0
    while not search.settled:
        width = search.hi - search.lo
        aim = _aim(search, budget_bytes)
        if aim is None or slow_aims >= 2:
            aim, slow_aims = _fallback(search), 0
        search.run(aim)
        slow_aims = slow_aims + 1 if 2 * (search.hi - search.lo) > width else 0
    return search.outcome()


def _fallback(search: SearchRecorder) -> int:
    """Bisect the bracket; while nothing has failed yet, double instead: the midpoint up to
    the cap can be far past any size that fits, and such a probe is the costliest one (a
    rank measuring past its limit runs it whole)."""
    if search.hi > search.cap:
        return min(2 * search.lo, search.cap)
    return (search.lo + search.hi) // 2


# The optimizer step's memory does not grow with the batch beyond the batch itself, so a
# single point says nothing about its slope; it is fitted once two sizes have run.
_FLAT_UNTIL_MEASURED = {"optimizer"}


def _aim(search: SearchRecorder, budget_bytes: int) -> int | None:
    """The predicted boundary clamped into ``(lo, hi)``; ``None`` when the model cannot aim."""
    lo, hi = search.lo, search.hi
    anchor = search.by_size[lo]
    if anchor.footprint_bytes is None or anchor.peak_allocated_bytes is None:
        return None
    if anchor.phase_peaks_bytes:
        # Phases are allocated bytes; the allocator cache and memory outside torch at lo
        # stand on top of them.
        limit = budget_bytes - (anchor.footprint_bytes - anchor.peak_allocated_bytes)
    else:
        limit = budget_bytes
    predictions = []
    for phase, points in _curves(search).items():
        if lo not in points:
            return None
        slope = _slope(search, phase, points, lo, hi)
        if slope is None:
            if phase in _FLAT_UNTIL_MEASURED:
                continue
            return None
        if slope > 0:  # a phase whose peak does not grow never binds
            predictions.append(lo + int((limit - points[lo]) // slope))
    predicted = min(predictions, default=search.cap)
    if predicted >= hi <= search.cap:
        return None  # a probe that ran contradicts the model here: bisect instead
    return min(max(predicted, lo + 1), hi - 1)


def _curves(search: SearchRecorder) -> dict[str, dict[int, int]]:
    """Measured points per phase, or of the whole footprint when phases were not recorded."""
    completed = [r for r in search.by_size.values() if r.footprint_bytes is not None]
    if search.by_size[search.lo].phase_peaks_bytes:
        curves: dict[str, dict[int, int]] = {}
        for result in completed:
            for phase, peak in result.phase_peaks_bytes.items():
                curves.setdefault(phase, {})[result.micro_batch_size] = peak
        return curves
    return {"footprint": {r.micro_batch_size: r.footprint_bytes for r in completed}}  # type: ignore[misc]


def _slope(
    search: SearchRecorder, phase: str, points: dict[int, int], lo: int, hi: int
) -> float | None:
    anchor = points[lo]
    if hi in points:  # a failure with a known peak: interpolate across the bracket
        return (points[hi] - anchor) / (hi - lo)
    below = [size for size in points if size < lo]
    if below:  # the secant through the nearest smaller probe: the most local slope
        other = max(below)
        return (anchor - points[other]) / (lo - other)
    if phase in _FLAT_UNTIL_MEASURED:
        return None
    breakdown = search.by_size[lo].breakdown
    if breakdown is None:
        return None
    return max(anchor - breakdown.resident_bytes, 1) / lo


Strategy = Callable[..., SearchOutcome]
STRATEGIES: dict[str, Strategy] = {"model": model_search, "bisect": bisect_search}


def run_search(strategy: str, probe: ProbeFn, *, cap: int, budget_bytes: int) -> SearchOutcome:
    try:
        chosen = STRATEGIES[strategy]
    except KeyError:
        raise BadInputError(
            f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)}"
        ) from None
    return chosen(probe, cap=cap, budget_bytes=budget_bytes)
