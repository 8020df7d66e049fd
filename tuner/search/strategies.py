"""Our two strategies: ``bisect`` (double, then bisect) and ``model`` (aim with an affine fit)."""

from __future__ import annotations

from collections.abc import Callable

from tuner.errors import BadInputError
from tuner.search.core import ProbeFn, SearchOutcome, SearchRecorder


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
    ``M* ≈ ⌊(budget − a) / b⌋``. The first aim comes from probe 1 alone: ``a`` is the
    resident part of its breakdown (weights, gradients, optimizer state), ``b`` the rest.
    That over-states ``b`` (temporaries that do not grow with the batch count as
    activations), so the first aim lands low and safe. Later aims take the secant through
    the measured peaks nearest the boundary. Aims stay strictly inside the bracket, so
    every probe narrows it. A bisection step replaces the aim when no slope is known, when
    a failed probe contradicts the prediction, or when aims have twice running failed to
    halve the bracket. The search ends when ``M*`` fits and ``M* + 1`` does not.
    """
    search = SearchRecorder(probe, cap)
    if not search.run(1).fits or cap == 1:
        return search.outcome()
    slow_aims = 0
    while not search.settled:
        width = search.hi - search.lo
        aim = _aim(search, budget_bytes)
        if aim is None or slow_aims >= 2:
            aim, slow_aims = (search.lo + search.hi) // 2, 0
        search.run(aim)
        slow_aims = slow_aims + 1 if 2 * (search.hi - search.lo) > width else 0
    return search.outcome()


def _aim(search: SearchRecorder, budget_bytes: int) -> int | None:
    """The predicted boundary clamped into ``(lo, hi)``; ``None`` when no slope is known."""
    lo, hi = search.lo, search.hi
    measured = {
        size: result.footprint_bytes
        for size, result in search.by_size.items()
        if result.footprint_bytes is not None
    }
    anchor = measured.get(lo)
    if anchor is None:
        return None
    slope = _slope(search, measured, lo, hi)
    if slope is None or slope <= 0:
        return None
    predicted = lo + int((budget_bytes - anchor) // slope)
    if predicted >= hi <= search.cap:
        return None  # a probe that ran contradicts the model here: bisect instead
    return min(max(predicted, lo + 1), hi - 1)


def _slope(search: SearchRecorder, measured: dict[int, int], lo: int, hi: int) -> float | None:
    anchor = measured[lo]
    if hi in measured:  # a failure with a known peak: interpolate across the bracket
        return (measured[hi] - anchor) / (hi - lo)
    below = [size for size in measured if size < lo]
    if below:  # the secant through the nearest smaller probe: the most local slope
        other = max(below)
        return (anchor - measured[other]) / (lo - other)
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
