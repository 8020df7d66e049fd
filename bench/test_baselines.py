"""What ``bench/search.py`` checks before it measures anything: the baselines
(``bench/baselines.py``) behave as their tools' documentation says, and our model search
under its previous rules is the one the benchmark compares with. Run by the benchmark
(:func:`bench.search.check_baselines`), not by the test suite: ``python -m pytest
bench/test_baselines.py``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.baselines import (
    BASELINES,
    accelerate_shrink,
    composer_halving,
    lightning_binsearch,
    lightning_power,
    model_previous,
)
from tests.curves import Curve, affine, kinked
from tuner.engine.search import model_search


def curve_with_m_star(m_star: int) -> Curve:
    """Sizes up to ``m_star`` fit, larger ones do not."""
    return Curve(affine(0, 10), budget=10 * m_star)


@pytest.mark.parametrize(
    ("m_star", "cap", "probed", "found"),
    [
        (100, 4096, [2, 4, 8, 16, 32, 64, 128], 64),
        (64, 4096, [2, 4, 8, 16, 32, 64, 128], 64),
        (2, 4096, [2, 4], 2),
        (1, 4096, [2, 1], 1),  # an OOM before any success halves and tries again
        (0, 4096, [2, 1], 0),  # nothing fits, not even after halving
        (100, 40, [2, 4, 8, 16, 32, 40], 40),  # doubling is clipped to the cap
        (100, 1, [1], 1),
    ],
)
def test_lightning_power_doubles_from_two_and_keeps_the_last_success(
    m_star: int, cap: int, probed: list[int], found: int
) -> None:
    curve = curve_with_m_star(m_star)
    outcome = lightning_power(curve, cap=cap)
    assert curve.calls == probed
    assert outcome.max_micro_batch_size == found


def test_lightning_power_halves_from_a_large_start_until_a_success_then_stops() -> None:
    curve = curve_with_m_star(5)
    outcome = lightning_power(curve, cap=4096, init_val=16)
    # 8 already failed, so the doubling after the success at 4 stops there.
    assert curve.calls == [16, 8, 4]
    assert outcome.max_micro_batch_size == 4


def test_lightning_power_respects_max_trials() -> None:
    curve = curve_with_m_star(10**6)
    outcome = lightning_power(curve, cap=10**6, max_trials=3)
    assert curve.calls == [2, 4, 8]
    assert outcome.max_micro_batch_size == 8


@pytest.mark.parametrize(("m_star", "found"), [(100, 95), (40, 38), (20, 19), (7, 6), (1, 1)])
def test_lightning_binsearch_takes_five_percent_off_the_boundary(m_star: int, found: int) -> None:
    curve = curve_with_m_star(m_star)
    outcome = lightning_binsearch(curve, cap=4096)
    assert outcome.max_micro_batch_size == found
    # It did find the boundary before taking the margin off.
    by_size = {p.micro_batch_size: p for p in outcome.probes}
    if m_star > 1:
        assert by_size[m_star].fits
        assert not by_size[m_star + 1].fits
        assert curve.calls[:2] == [2, 4]
    else:
        # Lightning returns 1 after 2 fails without trying it: the baseline does too.
        assert curve.calls == [2]


def test_lightning_binsearch_doubles_then_bisects() -> None:
    curve = curve_with_m_star(100)
    lightning_binsearch(curve, cap=4096)
    assert curve.calls == [2, 4, 8, 16, 32, 64, 128, 96, 112, 104, 100, 102, 101]


def test_lightning_binsearch_with_the_cap_fitting_takes_the_margin_off_the_cap() -> None:
    curve = curve_with_m_star(10**6)
    outcome = lightning_binsearch(curve, cap=200)
    assert curve.calls[-1] == 200
    assert outcome.max_micro_batch_size == 190


@given(m_star=st.integers(min_value=2, max_value=3000), margin=st.sampled_from([0.0, 0.05, 0.1]))
def test_lightning_binsearch_property(m_star: int, margin: float) -> None:
    curve = curve_with_m_star(m_star)
    outcome = lightning_binsearch(curve, cap=4096, margin=margin)
    assert outcome.max_micro_batch_size == max(1, int(m_star * (1 - margin)))
    assert len(set(curve.calls)) == len(curve.calls)


ACCELERATE_SEQUENCE = [128, 115, 103, 92, 82, 73, 65, 58, 52, 46, 41, 36, 32, 28, 25, 22, 19, 17]


@pytest.mark.parametrize(
    ("m_star", "found", "probes"),
    [(500, 128, 1), (120, 115, 2), (100, 92, 4), (30, 28, 14), (17, 17, 18)],
)
def test_accelerate_starts_at_128_and_shrinks_by_ten_percent(
    m_star: int, found: int, probes: int
) -> None:
    curve = curve_with_m_star(m_star)
    outcome = accelerate_shrink(curve, cap=4096)
    assert curve.calls == ACCELERATE_SEQUENCE[:probes]
    assert outcome.max_micro_batch_size == found


def test_accelerate_gives_zero_when_nothing_fits_and_starts_below_the_cap() -> None:
    curve = curve_with_m_star(0)
    outcome = accelerate_shrink(curve, cap=10)
    assert curve.calls == [10, 9, 8, 7, 6, 5, 4, 3, 2, 1]
    assert outcome.max_micro_batch_size == 0


@given(m_star=st.integers(min_value=0, max_value=300), start=st.integers(1, 300))
def test_accelerate_property_every_step_is_ninety_percent_of_the_last(
    m_star: int, start: int
) -> None:
    curve = curve_with_m_star(m_star)
    outcome = accelerate_shrink(curve, cap=4096, starting_batch_size=start)
    assert curve.calls[0] == start
    assert all(b == int(a * 0.9) for a, b in zip(curve.calls, curve.calls[1:], strict=False))
    assert all(not p.fits for p in outcome.probes[:-1])
    found = outcome.max_micro_batch_size
    assert found == (curve.calls[-1] if outcome.probes[-1].fits else 0)
    assert found <= m_star


@pytest.mark.parametrize(
    ("m_star", "batch_size", "probed", "found"),
    [
        (100, 512, [512, 256, 128, 64], 64),
        (512, 512, [512], 512),
        (3, 96, [96, 48, 24, 12, 6, 3], 3),
        (0, 8, [8, 4, 2, 1], 0),
    ],
)
def test_composer_halves_from_the_batch_size(
    m_star: int, batch_size: int, probed: list[int], found: int
) -> None:
    curve = curve_with_m_star(m_star)
    outcome = composer_halving(curve, cap=4096, batch_size=batch_size)
    assert curve.calls == probed
    assert outcome.max_micro_batch_size == found


def test_composer_without_a_batch_size_starts_at_the_cap() -> None:
    curve = curve_with_m_star(100)
    outcome = composer_halving(curve, cap=1000)
    assert curve.calls == [1000, 500, 250, 125, 62]
    assert outcome.max_micro_batch_size == 62


def test_baselines_are_registered_by_name() -> None:
    assert {
        "lightning-power": lightning_power,
        "lightning-binsearch": lightning_binsearch,
        "accelerate": accelerate_shrink,
        "composer": composer_halving,
    } == BASELINES


@pytest.mark.parametrize("m_star", [400, 1000])
def test_the_previous_rules_find_m_star_in_more_probes_than_the_current_ones(
    m_star: int,
) -> None:
    # The previous rules (the secant through size 1, open brackets judged by halving)
    # took 6 and 7 probes here: 1, 32, 348, then a doubling to 696, ...
    resident = 110_776
    footprint = kinked(resident)
    budget = (footprint(m_star) + footprint(m_star + 1)) // 2
    searched = []
    for search in (model_search, model_previous):
        curve = Curve(footprint, budget, capacity=int(budget / 0.95), resident=resident)
        outcome = search(curve, cap=4096, budget_bytes=budget)
        assert outcome.max_micro_batch_size == m_star, search
        searched.append(len(outcome.probes))
    current, previous = searched
    assert previous > current
