"""Our two strategies: ``bisect`` (double, then bisect) and ``model`` (aim with a dry run's
predictions where there are some, else with an affine fit), and the search from a guess
that ``model`` and ``--seq-lens`` share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tuner.core.errors import BadInputError
from tuner.core.results import ProbeResult
from tuner.engine.search.core import PredictFn, ProbeFn, SearchOutcome, SearchRecorder


def bisect_search(
    probe: ProbeFn,
    *,
    cap: int,
    budget_bytes: int,
    predict: PredictFn | None = None,
    aim_first: bool = True,
) -> SearchOutcome:
    """Double from 1 until a probe fails (or the cap fits), then bisect the bracket."""
    del budget_bytes, predict, aim_first  # bisection needs only the verdicts
    search = SearchRecorder(probe, cap)
    size = 1
    while search.run(size).fits and size < cap:
        size = min(2 * size, cap)
    while not search.settled:
        search.run((search.lo + search.hi) // 2)
    return search.outcome()


@dataclass(frozen=True)
class ModelRules:
    """The model search's choices that changed, kept switchable so that ``bench/search.py``
    measures the current rules against the previous ones on the same curves."""

    # Past probe 1, take the slope anchored at the resident bytes, ``(peak(lo) − R) / lo``,
    # rather than the secant through size 1 (whose peak holds weight-sized temporaries
    # that larger sizes hide: the secant through it is too flat and aims too high).
    anchor_past_size_one: bool = True
    # Before any size has failed, judge an aim by how far it moved ``lo`` (slow: less than
    # doubled it) rather than by halving a bracket whose top is only the cap.
    judge_open_aims_by_growth: bool = True


def model_search(
    probe: ProbeFn,
    *,
    cap: int,
    budget_bytes: int,
    predict: PredictFn | None = None,
    aim_first: bool = True,
) -> SearchOutcome:
    """Aim at the predicted ``M*`` and confirm the boundary with probes.

    With ``predict`` (a dry run's predicted probes, :mod:`tuner.engine.dry_run`), the search
    first finds the ``M*`` of the predictions (these rules, run on predicted probes, which
    cost no device memory) and starts there (:func:`hinted_search`): where the predictions
    are exact, ``M*`` fits and ``M* + 1`` does not, two probes. Every later aim takes the
    predictions calibrated on the probes that ran (:func:`_predicted_aim`). With
    ``aim_first`` false (predictions of another setting, which only calibration makes
    useful), size 1 is probed first, then the calibrated aims. Without predictions:

    Peak memory is close to affine in the micro batch size, ``peak(m) ≈ a + b·m``, so
    ``M* ≈ ⌊(budget − a) / b⌋``. A step has two phases whose peaks grow differently: the
    forward and backward of the micro batches (activations: steep) and the optimizer step
    (weight-sized temporaries: nearly flat). The peak is the larger of the two, so each is
    fitted on its own and ``M*`` is the smallest of their predictions.

    Each aim is ``lo + (limit − peak(lo)) / slope`` per phase. The slope from one size is
    anchored at the resident weights, gradients and optimizer state ``R``:
    ``slope = (peak(lo) − R) / lo``. At ``lo = 1`` that over-states it (weight-sized
    temporaries count too), so the first aim lands low and safe; at the larger ``lo`` it
    lands on, activations dominate and the anchored slope is within a few percent, where
    the secant through size 1 is too flat (size 1's peak holds those temporaries, which
    larger sizes hide); unless the anchored slope is twice the secant or more (then
    temporaries still dominate at ``lo``, and the secant is the better guide). Once two
    sizes past 1 have run, aims take, per phase, the secant
    through the measured peaks nearest the boundary. Aims stay strictly inside the
    bracket, so every probe narrows it. A bisection step replaces the aim when no slope is
    known, when a failed probe contradicts the prediction, or when aims have twice
    running been slow: failed to halve the bracket, or, while no size has failed yet,
    failed to double ``lo`` (then it doubles). The search ends when ``M*`` fits and
    ``M* + 1`` does not.
    """
    if predict is not None and not aim_first:
        # Predictions of another setting (one process for ranks): size 1 first, the
        # predictions only once calibrated on it.
        search = SearchRecorder(probe, cap)
        if search.run(1).fits and cap > 1:
            return continue_with_model(search, budget_bytes=budget_bytes, predict=predict)
        return search.outcome()
    if predict is not None:
        guess = _predicted_size(predict, cap=cap, budget_bytes=budget_bytes)
        if guess is not None:
            search = SearchRecorder(probe, cap)
            first = search.run(min(max(guess, 1), cap))
            if first.footprint_bytes is None and not first.fits and first.micro_batch_size > 1:
                # Out of memory before a peak: the predictions are far too low (a fused
                # kernel's workspace they do not see, say), and calibrating them would take
                # probes the rules below do not: from size 1, as without predictions.
                # The failed guess is known to that search, not counted against its aims.
                def known_or_probe(size: int) -> ProbeResult:
                    return first if size == first.micro_batch_size else probe(size)

                fresh = search_with_model(
                    known_or_probe,
                    cap=cap,
                    budget_bytes=budget_bytes,
                    rules=ModelRules(),
                    predict=predict,
                    calibrate_from=2,  # from size 1 alone they would aim far too high again
                )
                ran = [first, *(p for p in fresh.probes if p is not first)]
                return SearchOutcome(fresh.max_micro_batch_size, ran)
            return continue_with_model(search, budget_bytes=budget_bytes, predict=predict)
    return search_with_model(probe, cap=cap, budget_bytes=budget_bytes, rules=ModelRules())


def hinted_search(
    probe: ProbeFn,
    *,
    cap: int,
    budget_bytes: int,
    guess: int,
    predict: PredictFn | None = None,
) -> SearchOutcome:
    """Start from a predicted ``M*`` ``guess`` (clamped into ``[1, cap]``): probe it, then
    its neighbour towards the boundary. A right guess ``g`` takes two probes: ``g`` fits and
    ``g + 1`` does not, or ``g`` does not and ``g − 1`` fits. Otherwise the bracket those
    probes left is handed to the model search's rules (:func:`continue_with_model`, aimed by
    ``predict`` where given), so the answer is as exact as the model search's.

    A guess more than one too high leaves no fitting size to aim from: sizes are halved
    from the smallest failure until one fits (the model's aim is good from a size near
    the boundary, where activations dominate), then the model search goes on from there.
    """
    search = SearchRecorder(probe, cap)
    size = min(max(guess, 1), cap)
    if predict is not None:
        # The predictions say where to go next from whatever the guess measured; a guess
        # that ran out of memory before anything was measured is followed by their own
        # M* below it, so a guess one too high costs one more probe.
        if not search.run(size).fits and search.hi > 1 and size not in _measured(search):
            below = _predicted_size(predict, cap=search.hi - 1, budget_bytes=budget_bytes)
            if below is not None:
                search.run(max(below, 1))
        return continue_with_model(search, budget_bytes=budget_bytes, predict=predict)
    if search.run(size).fits:
        if size < cap:
            search.run(size + 1)
    elif size > 1:
        search.run(size - 1)
    while search.lo == 0 and not search.settled:
        search.run(search.hi // 2)
    return continue_with_model(search, budget_bytes=budget_bytes)


def search_with_model(
    probe: ProbeFn,
    *,
    cap: int,
    budget_bytes: int,
    rules: ModelRules,
    predict: PredictFn | None = None,
    calibrate_from: int = 1,
) -> SearchOutcome:
    """:func:`model_search` from size 1 under ``rules`` (aimed by ``predict`` once
    ``calibrate_from`` footprints are measured, where given)."""
    search = SearchRecorder(probe, cap)
    if not search.run(1).fits or cap == 1:
        return search.outcome()
    return continue_with_model(
        search,
        budget_bytes=budget_bytes,
        rules=rules,
        predict=predict,
        calibrate_from=calibrate_from,
    )


def continue_with_model(
    search: SearchRecorder,
    *,
    budget_bytes: int,
    rules: ModelRules | None = None,
    predict: PredictFn | None = None,
    calibrate_from: int = 1,
) -> SearchOutcome:
    """The model search's rules from the bracket ``search`` holds, until it settles; aims
    from ``predict``'s predictions where they can be made (:func:`_predicted_aim`), once
    ``calibrate_from`` probes have measured footprints.

    ``search`` must hold a size that fits (``lo ≥ 1``), every aim without predictions
    starts from it; with predictions, a failure is enough (until one fits, a size the
    predictions cannot aim at is halved).
    """
    if search.lo < 1 and not search.settled and predict is None:
        raise ValueError("the model search continues from a size that fits")
    rules = rules or ModelRules()
    # Slow aims are counted per kind of aim (predicted, model), so that one kind's misses
    # do not make the other give way to bisection; size 1 as a start is not an aim.
    slow_aims = {"predicted": 0, "model": 0}
    while not search.settled:
        lo, width, was_open = search.lo, search.hi - search.lo, search.hi > search.cap
        kind = "predicted"
        aim = (
            None
            if predict is None
            else _predicted_aim(search, budget_bytes, predict, calibrate_from)
        )
        if aim is None and lo >= 1:
            kind, aim = "model", _aim(search, budget_bytes, rules)
        if aim is None and lo == 0 and 1 not in search.by_size:
            kind, aim = "start", 1  # nothing measured fits yet: where the probes' rules start
        if aim is None or slow_aims.get(kind, 0) >= _SLOW_AIMS_ALLOWED.get(kind, 2):
            kind, aim = "fallback", _fallback(search)
            slow_aims = dict.fromkeys(slow_aims, 0)
        search.run(aim)
        if kind == "fallback":
            kind = "model"  # a bisection step is judged as the model's aims are
        if kind not in slow_aims:
            continue
        if rules.judge_open_aims_by_growth and was_open and search.hi > search.cap:
            slow = search.lo < 2 * lo
        else:
            slow = 2 * (search.hi - search.lo) > width
        slow_aims[kind] = slow_aims[kind] + 1 if slow else 0
    return search.outcome()


# Calibrated predictions may creep up on M* from below (each aim fits, one closer) while
# the bracket's top is a far failure; they give way to bisection one miss later.
_SLOW_AIMS_ALLOWED = {"predicted": 3, "model": 2}


class _NoPrediction(Exception):
    """A dry run could not predict a size: the search aims from probes alone."""


def _predicted(predict: PredictFn, size: int, budget_bytes: int) -> ProbeResult:
    """``predict(size)``, its verdict taken against ``budget_bytes``."""
    result = predict(size)
    if result is None or result.footprint_bytes is None:
        raise _NoPrediction
    return result.model_copy(update={"fits": result.footprint_bytes <= budget_bytes})


def _predicted_size(predict: PredictFn, *, cap: int, budget_bytes: int) -> int | None:
    """``M*`` of the predictions (the model rules run on them), ``None`` without them."""
    try:
        return search_with_model(
            lambda size: _predicted(predict, size, budget_bytes),
            cap=cap,
            budget_bytes=budget_bytes,
            rules=ModelRules(),
        ).max_micro_batch_size
    except _NoPrediction:
        return None


def _predicted_aim(
    search: SearchRecorder, budget_bytes: int, predict: PredictFn, calibrate_from: int = 1
) -> int | None:
    """The largest size in ``(lo, hi)`` that the predictions, calibrated on the probes
    that ran, say fits; ``lo + 1`` where they put ``M*`` at ``lo`` itself.

    Calibration: ``footprint ≈ α · predicted + β``. Through two measured footprints (``lo``
    and the measured probe nearest it, ``hi`` first) it corrects a constant error (a
    kernel's workspace) and one in proportion (the allocator's rounding and cache) alike;
    from one, ``β = 0`` (a proportional error: of the two, the assumption that errs low, so
    the next probe fits and makes the second point). Then ``M*`` is the predictions' ``M*``
    for the budget ``(budget − β) / α``, found by the model rules on predicted probes below
    ``hi``. ``None`` without a measured footprint, or with one only after a probe ran out
    of memory unmeasured (the predictions were far too low, and one point cannot say how
    the error grows): the probes' own rules aim then, from size 1 while nothing fits."""
    lo, hi = search.lo, search.hi
    measured = sorted(_measured(search), key=lambda size: (size != lo, size != hi, abs(size - lo)))
    if calibrate_from > 1:
        # Size 1 holds weight-sized temporaries larger sizes hide: a calibration that must
        # not miss is made away from it.
        measured = [size for size in measured if size > 1]
    if len(measured) < calibrate_from or not measured:
        return None
    if len(measured) == 1 and _ran_out_unmeasured(search):
        # A probe that ran out of memory unmeasured showed the predictions far too low;
        # one measured point cannot say how the error grows, the probes' own rules can.
        return None
    try:
        points = [
            (
                _predicted(predict, size, budget_bytes).footprint_bytes,
                search.by_size[size].footprint_bytes,
            )
            for size in measured[:2]
        ]
        scale, offset = _calibration(points)  # type: ignore[arg-type]
        if scale <= 0:
            return None  # nothing measured above zero: no line to calibrate with
        target = int((budget_bytes - offset) / scale)
        found = search_with_model(
            lambda size: _predicted(predict, size, target),
            cap=hi - 1,
            budget_bytes=target,
            rules=ModelRules(),
        ).max_micro_batch_size
    except _NoPrediction:
        return None
    return min(max(found, lo + 1), hi - 1)


def _measured(search: SearchRecorder) -> list[int]:
    """Sizes probed with a footprint (those that ran out of memory mid-step have none)."""
    return [size for size, r in search.by_size.items() if r.footprint_bytes is not None]


def _ran_out_unmeasured(search: SearchRecorder) -> bool:
    return any(r.footprint_bytes is None for r in search.by_size.values())


def _calibration(points: list[tuple[int, int]]) -> tuple[float, float]:
    """``(α, β)`` with ``measured ≈ α · predicted + β`` through one or two points
    ``(predicted, measured)``; one point (or two that do not fix a rising line): ``β = 0``."""
    (p0, m0), *rest = points
    if rest:
        p1, m1 = rest[0]
        if p1 != p0 and (m1 - m0) / (p1 - p0) > 0:
            scale = (m1 - m0) / (p1 - p0)
            return scale, m0 - scale * p0
    return (m0 / p0, 0.0) if p0 > 0 else (1.0, 0.0)


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


def _aim(search: SearchRecorder, budget_bytes: int, rules: ModelRules) -> int | None:
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
        slope = _slope(search, phase, points, lo, hi, rules)
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
    search: SearchRecorder,
    phase: str,
    points: dict[int, int],
    lo: int,
    hi: int,
    rules: ModelRules,
) -> float | None:
    anchor = points[lo]
    if hi in points:  # a failure with a known peak: interpolate across the bracket
        return (points[hi] - anchor) / (hi - lo)
    below = [size for size in points if size < lo]
    anchored = _anchored_slope(search, phase, anchor, lo)
    if not below:
        return anchored
    other = max(below)  # the secant through the nearest smaller probe: the most local
    secant = (anchor - points[other]) / (lo - other)
    if other > 1 or anchored is None or not rules.anchor_past_size_one:
        return secant
    # Twice the secant or more: the bytes above the resident parts at lo are still mostly
    # fixed temporaries, not samples, and the secant is the better guide.
    return secant if anchored >= 2 * secant else anchored


def _anchored_slope(search: SearchRecorder, phase: str, peak: int, size: int) -> float | None:
    """``(peak − resident) / size``: every byte above the resident parts counted per sample."""
    if phase in _FLAT_UNTIL_MEASURED:
        return None
    breakdown = search.by_size[size].breakdown
    if breakdown is None:
        return None
    return max(peak - breakdown.resident_bytes, 1) / size


Strategy = Callable[..., SearchOutcome]
STRATEGIES: dict[str, Strategy] = {"model": model_search, "bisect": bisect_search}


def run_search(
    strategy: str,
    probe: ProbeFn,
    *,
    cap: int,
    budget_bytes: int,
    predict: PredictFn | None = None,
    aim_first: bool = True,
) -> SearchOutcome:
    try:
        chosen = STRATEGIES[strategy]
    except KeyError:
        raise BadInputError(
            f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)}"
        ) from None
    return chosen(probe, cap=cap, budget_bytes=budget_bytes, predict=predict, aim_first=aim_first)
