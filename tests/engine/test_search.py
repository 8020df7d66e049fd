"""tuner.engine.search: bisect and model strategies find the exact M* on monotone memory curves."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.curves import (
    Curve,
    affine,
    affine_with_jump,
    flat_then_affine,
    kinked,
    steps,
    two_phases,
)
from tests.engine.limits import limit_with_m_star
from tuner.core.errors import BadInputError
from tuner.core.results import ProbeResult
from tuner.engine.backends import CpuBackend
from tuner.engine.probe import Prober
from tuner.engine.search import (
    STRATEGIES,
    SearchOutcome,
    SearchRecorder,
    bisect_search,
    model_search,
    run_search,
)
from tuner.engine.workload import load_workload

MiB = 2**20
SEARCHES = {"model": model_search, "bisect": bisect_search}


@contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """Turn a search that never settles into a failure instead of a hung test run."""

    def expire(_signum: int, _frame: FrameType | None) -> None:
        raise TimeoutError(f"the search did not finish within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run(strategy: str, curve: Curve, cap: int) -> SearchOutcome:
    with time_limit(10):
        return SEARCHES[strategy](curve, cap=cap, budget_bytes=curve.budget)


def assert_exact(outcome: SearchOutcome, curve: Curve, cap: int) -> None:
    """M* equals brute force, and the answer is a probe that ran, pinned from both sides."""
    expected = curve.brute_force(cap)
    sizes = [p.micro_batch_size for p in outcome.probes]
    assert outcome.max_micro_batch_size == expected, sizes
    assert sizes == curve.calls, "the outcome must list exactly the probes that ran"
    assert len(set(sizes)) == len(sizes), f"a size was probed twice: {sizes}"
    assert all(1 <= m <= cap for m in sizes)
    by_size = {p.micro_batch_size: p for p in outcome.probes}
    if expected == 0:
        assert not by_size[1].fits
    else:
        assert by_size[expected].fits
    if expected < cap:
        assert expected + 1 in by_size, f"M*+1 = {expected + 1} never ran: {sizes}"
        assert not by_size[expected + 1].fits


@st.composite
def curves(draw: st.DrawFn) -> tuple[Curve, int]:
    """A monotone curve of one of five shapes, a cap, and a budget anywhere along it."""
    kind = draw(st.sampled_from(["affine", "flat_then_affine", "steps", "jump", "phases"]))
    phases = None
    fixed = draw(st.integers(min_value=0, max_value=8 * 2**30))
    slope = draw(st.integers(min_value=1, max_value=64 * MiB))
    if kind == "affine":
        granule = draw(st.sampled_from([1, 512, 2 * MiB, 20 * MiB]))
        footprint = affine(fixed, slope, granule)
    elif kind == "flat_then_affine":
        flat = fixed + slope * draw(st.integers(min_value=0, max_value=3000))
        footprint = flat_then_affine(flat, fixed, slope)
    elif kind == "steps":
        width = draw(st.integers(min_value=1, max_value=600))
        footprint = steps(fixed, width, slope)
    elif kind == "jump":
        at = draw(st.integers(min_value=1, max_value=4000))
        footprint = affine_with_jump(fixed, slope, at, draw(st.integers(0, 512 * MiB)))
    else:
        # Forward/backward grows steeply; the optimizer step is high and nearly flat, so
        # either phase may set the peak, and which one can change along the curve.
        optimizer = affine(
            fixed + draw(st.integers(min_value=0, max_value=4 * 2**30)),
            draw(st.integers(min_value=0, max_value=slope)),
        )
        granule = draw(st.sampled_from([1, 2 * MiB]))
        footprint, phases = two_phases(affine(fixed, slope), optimizer, granule)
    cap = draw(st.integers(min_value=1, max_value=4096))
    # Aim the budget near the footprint of some size, so M* lands anywhere in [0, cap].
    target = draw(st.integers(min_value=1, max_value=cap + 2))
    budget = max(0, footprint(target) + draw(st.integers(min_value=-slope, max_value=slope)))
    oom_above = draw(st.none() | st.integers(min_value=0, max_value=2 * slope + 64 * MiB))
    capacity = None if oom_above is None else budget + oom_above
    first = footprint(1)
    resident = draw(
        st.none()
        | st.just(fixed)
        | st.integers(min_value=0, max_value=2 * first + 1)
        | st.just(first)  # every byte "resident": the breakdown gives no slope at all
    )
    curve = Curve(footprint, budget, capacity=capacity, resident=resident, phases=phases)
    return curve, cap


@pytest.mark.parametrize("strategy", sorted(SEARCHES))
@given(case=curves())
@example(case=(Curve(affine(100, 10), budget=105), 50))  # 1 does not fit: M* = 0
@example(case=(Curve(affine(100, 10), budget=10**9), 50))  # everything fits: M* = cap
@example(case=(Curve(affine(100, 10), budget=110), 1))  # cap 1, fits
@example(case=(Curve(affine(100, 10), budget=109), 1))  # cap 1, does not fit
@example(case=(Curve(affine(100, 10), budget=120, capacity=120), 4096))
@example(case=(Curve(steps(0, 64, MiB), budget=3 * MiB, resident=0), 4096))
def test_strategy_matches_brute_force_on_monotone_curves(
    strategy: str, case: tuple[Curve, int]
) -> None:
    curve, cap = case
    curve.calls.clear()  # explicit examples are shared between the two strategies
    assert_exact(run(strategy, curve, cap), curve, cap)


@pytest.mark.parametrize("strategy", sorted(SEARCHES))
@pytest.mark.parametrize(
    ("footprint", "budget", "cap", "expected"),
    [
        (affine(1000, 100), 1000, 64, 0),  # one sample is already too much
        (affine(1000, 100), 1100, 64, 1),
        (affine(1000, 100), 10**6, 64, 64),  # the cap fits
        (affine(1000, 100), 1100, 1, 1),  # cap 1
        (affine(1000, 100), 1099, 1, 0),
        (affine(1000, 100), 1000 + 100 * 37, 4096, 37),
        (affine(1000, 100, granule=2048), 8192, 4096, 71),  # 1000 + 100·71 ≤ 8192
        (steps(0, 16, 1000), 3000, 4096, 64),  # sizes 49..64 take 3000
        (flat_then_affine(50_000, 0, 10), 60_000, 4096, 4096),
        (flat_then_affine(50_000, 0, 100), 60_000, 4096, 600),
    ],
)
def test_strategy_known_answers(
    strategy: str, footprint: Callable[[int], int], budget: int, cap: int, expected: int
) -> None:
    for capacity in (None, budget):  # with peaks above the budget, and with OOMs there
        curve = Curve(footprint, budget, capacity=capacity, resident=footprint(1) // 2)
        outcome = run(strategy, curve, cap)
        assert outcome.max_micro_batch_size == expected
        assert_exact(outcome, curve, cap)


def test_bisect_doubles_from_one_then_bisects_the_bracket() -> None:
    curve = Curve(affine(0, 10), budget=50)  # M* = 5
    outcome = run("bisect", curve, 100)
    assert [p.micro_batch_size for p in outcome.probes] == [1, 2, 4, 8, 6, 5]


def test_bisect_stops_doubling_at_the_cap() -> None:
    curve = Curve(affine(0, 10), budget=10**6)
    outcome = run("bisect", curve, 20)
    assert [p.micro_batch_size for p in outcome.probes] == [1, 2, 4, 8, 16, 20]
    assert outcome.max_micro_batch_size == 20


def test_model_search_stops_after_probe_one_when_it_does_not_fit() -> None:
    curve = Curve(affine(1000, 10), budget=500, resident=1000)
    outcome = run("model", curve, 4096)
    assert curve.calls == [1]
    assert outcome.max_micro_batch_size == 0


def test_model_search_aims_from_the_breakdown_and_needs_few_probes_on_an_affine_curve() -> None:
    # With an exact breakdown the first aim is M* itself; then only M*+1 remains to check.
    curve = Curve(affine(3 * 2**30, 5 * MiB), budget=3 * 2**30 + 5 * MiB * 1234, resident=3 * 2**30)
    model = run("model", curve, 4096)
    model_calls = list(curve.calls)
    curve.calls.clear()
    bisect = run("bisect", curve, 4096)
    assert model.max_micro_batch_size == bisect.max_micro_batch_size == 1234
    assert len(model_calls) <= 4 < len(bisect.probes)


def test_probes_never_leave_one_to_cap() -> None:
    curve = Curve(affine(0, 1), budget=10**9, resident=0)
    for strategy in SEARCHES:
        curve.calls.clear()
        outcome = run(strategy, curve, 7)
        assert outcome.max_micro_batch_size == 7
        assert max(curve.calls) == 7


def test_run_search_dispatches_by_name() -> None:
    curve = Curve(affine(0, 10), budget=50)
    outcome = run_search("bisect", curve, cap=100, budget_bytes=50)
    assert [p.micro_batch_size for p in outcome.probes] == [1, 2, 4, 8, 6, 5]
    assert set(STRATEGIES) == {"model", "bisect"}


def test_run_search_refuses_an_unknown_strategy_before_probing() -> None:
    curve = Curve(affine(0, 10), budget=50)
    with pytest.raises(BadInputError, match=r"unknown strategy 'greedy'.*model, bisect"):
        run_search("greedy", curve, cap=100, budget_bytes=50)
    assert curve.calls == []


def test_recorder_runs_each_size_once_and_keeps_the_bracket() -> None:
    curve = Curve(affine(0, 10), budget=50)
    recorder = SearchRecorder(curve, cap=10)
    assert (recorder.lo, recorder.hi) == (0, 11)
    first = recorder.run(3)
    assert recorder.run(3) is first
    recorder.run(7)
    assert curve.calls == [3, 7]
    assert (recorder.lo, recorder.hi, recorder.settled) == (3, 7, False)
    recorder.run(5)
    recorder.run(6)
    assert recorder.settled
    assert recorder.outcome().max_micro_batch_size == 5


@pytest.mark.parametrize("size", [0, 11, -1])
def test_recorder_refuses_sizes_outside_the_range(size: int) -> None:
    recorder = SearchRecorder(Curve(affine(0, 10), budget=50), cap=10)
    with pytest.raises(ValueError, match="outside"):
        recorder.run(size)


def test_recorder_refuses_a_cap_below_one() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        SearchRecorder(Curve(affine(0, 10), budget=50), cap=0)


@pytest.mark.parametrize("strategy", sorted(SEARCHES))
@pytest.mark.parametrize(
    ("optimizer_fixed", "budget", "expected"),
    [
        (5000, 5100, 100),  # the flat optimizer phase binds: 5000 + m ≤ 5100
        (0, 5100, 410),  # the steep forward/backward phase binds: 1000 + 10·m ≤ 5100
        (6000, 5100, 0),  # the optimizer step alone is over budget
    ],
)
def test_strategy_with_phase_peaks_finds_the_binding_phase(
    strategy: str, optimizer_fixed: int, budget: int, expected: int
) -> None:
    footprint, phases = two_phases(affine(1000, 10), affine(optimizer_fixed, 1))
    curve = Curve(footprint, budget, resident=800, phases=phases)
    outcome = run(strategy, curve, 4096)
    assert outcome.max_micro_batch_size == expected
    assert_exact(outcome, curve, 4096)


@pytest.mark.parametrize("m_star", [400, 1000])
def test_model_search_aims_past_size_one_with_the_resident_anchored_slope(m_star: int) -> None:
    resident = 110_776
    footprint = kinked(resident)
    budget = (footprint(m_star) + footprint(m_star + 1)) // 2
    curve = Curve(footprint, budget, capacity=int(budget / 0.95), resident=resident)
    outcome = run("model", curve, 4096)
    assert_exact(outcome, curve, 4096)
    assert len(outcome.probes) <= 5, curve.calls


def test_model_search_on_a_real_tiny_model_needs_few_probes() -> None:
    """A real MLP on the CPU backend, limited so that ``M* = 400``: the previous rules
    took 7 probes, the floor is 3 (size 1, M*, M* + 1)."""
    workload = load_workload(
        "examples.mlp:workload", {"in_features": 32, "hidden": 64, "layers": 2}
    )
    limit = limit_with_m_star(workload, 400)
    with Prober(workload, CpuBackend(limit), headroom=0.05) as prober:
        outcome = model_search(prober, cap=4096, budget_bytes=prober.budget_bytes)
    sizes = [p.micro_batch_size for p in outcome.probes]
    assert outcome.max_micro_batch_size == 400, sizes
    assert {400, 401} <= set(sizes)
    assert len(sizes) <= 5, sizes


def distorted(curve: Curve, factor: float, constant: int) -> Callable[[int], ProbeResult]:
    """Predictions of ``curve`` that are wrong by ``factor`` and ``constant`` (a GPU's
    allocator cache, a kernel's workspace), with phases and breakdowns as the curve has."""

    def wrong(peak: Callable[[int], int]) -> Callable[[int], int]:
        return lambda m: max(1, int(peak(m) * factor) + constant)

    phases = None if curve.phases is None else {n: wrong(f) for n, f in curve.phases.items()}
    return Curve(wrong(curve.footprint), curve.budget, resident=curve.resident, phases=phases)


@given(
    case=curves(),
    factor=st.floats(min_value=0.25, max_value=4.0),
    share=st.floats(min_value=-0.5, max_value=0.5),
    missing_from=st.none() | st.integers(min_value=1, max_value=4096),
)
@example(  # a footprint of zero bytes: no line to calibrate with
    case=(Curve(steps(0, 64, MiB), budget=0), 2), factor=1.0, share=0.0, missing_from=None
)
def test_model_search_with_predictions_is_exact_whatever_they_predict(
    case: tuple[Curve, int], factor: float, share: float, missing_from: int | None
) -> None:
    """Predictions only aim: wrong ones (by any factor and constant), or ones that stop at
    some size (a step fake tensors cannot run there), cost probes, never exactness."""
    curve, cap = case
    predictions = distorted(curve, factor, int(share * curve.budget))

    def predict(m: int) -> ProbeResult | None:
        return None if missing_from is not None and m >= missing_from else predictions(m)

    with time_limit(10):
        outcome = model_search(curve, cap=cap, budget_bytes=curve.budget, predict=predict)
    assert_exact(outcome, curve, cap)


@pytest.mark.parametrize(
    ("factor", "share", "most"),
    [(1.0, 0.0, 2), (0.97, 0.0, 4), (1.03, 0.0, 4), (1.0, -0.05, 4), (1.0, 0.05, 4)],
)
@pytest.mark.parametrize("m_star", [3, 40, 700])
def test_model_search_with_predictions_takes_two_probes_when_exact_and_few_when_not(
    factor: float, share: float, most: int, m_star: int
) -> None:
    """Exact predictions: M* and M* + 1. Off by 3% or by 5% of the budget: the probes
    calibrate them (two measured footprints fix both errors), at most four."""
    footprint, phases = two_phases(affine(300 * MiB, 2 * MiB), affine(310 * MiB, 1000))
    budget = (footprint(m_star) + footprint(m_star + 1)) // 2
    curve = Curve(footprint, budget, capacity=budget + budget // 20, phases=phases,
                  resident=250 * MiB)  # fmt: skip
    predict = distorted(curve, factor, int(share * budget))
    outcome = model_search(curve, cap=4096, budget_bytes=budget, predict=predict)
    assert_exact(outcome, curve, 4096)
    assert len(outcome.probes) <= most, [p.micro_batch_size for p in outcome.probes]


@pytest.mark.parametrize("m_star", [3, 40, 700])
def test_predictions_far_too_low_cost_one_probe_over_the_search_without_them(
    m_star: int,
) -> None:
    """Per-sample bytes predicted 60% low (a fused kernel's workspace the fake step does
    not show): the guess runs out of memory unmeasured, and the search goes on from size 1
    as it would without predictions (calibrating them once two sizes past 1 are measured):
    the wrong predictions cost the one failed guess, never more."""
    fixed, slope = 300 * MiB, 2 * MiB
    footprint = affine(fixed, slope)
    budget = (footprint(m_star) + footprint(m_star + 1)) // 2
    curve = Curve(footprint, budget, capacity=budget + budget // 20, resident=250 * MiB)
    predicted = Curve(affine(fixed, int(slope * 0.4)), budget, resident=250 * MiB)
    outcome = model_search(curve, cap=4096, budget_bytes=budget, predict=predicted)
    assert_exact(outcome, curve, 4096)
    plain = model_search(
        Curve(footprint, budget, capacity=budget + budget // 20, resident=250 * MiB),
        cap=4096,
        budget_bytes=budget,
    )
    sizes = [p.micro_batch_size for p in outcome.probes]
    assert not outcome.probes[0].fits
    assert len(sizes) <= len(plain.probes) + 1, sizes
