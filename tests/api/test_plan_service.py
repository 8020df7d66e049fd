"""The plan functions the service answers with (torch-free): the OOM clamp, estimates from
another device's affine fit, and the messages when nothing is left."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.api.documents import MiB, sample_probe
from tuner.core.errors import BadInputError, NothingFitsError
from tuner.core.plan import (
    below_oom,
    estimate_max_micro_batch,
    recommend_estimated,
    recommend_measured,
)
from tuner.core.results import AffineFit

FIT = AffineFit(fixed_bytes=100 * MiB, bytes_per_sample=10 * MiB, points=3)


@pytest.mark.parametrize(
    ("m_star", "oom", "expected"), [(12, None, 12), (12, 10, 9), (12, 20, 12), (12, 1, 0)]
)
def test_an_oom_keeps_the_limit_below_it(m_star: int, oom: int | None, expected: int) -> None:
    assert below_oom(m_star, oom) == expected


def test_the_estimate_is_the_largest_size_under_the_budget() -> None:
    # 95% of 800 MiB = 760 MiB; (760 - 100) / 10 = 66.
    assert estimate_max_micro_batch(FIT, 800 * MiB, 0.05) == 66
    assert estimate_max_micro_batch(FIT, 800 * MiB, 0.05, size_cap=50) == 50
    assert estimate_max_micro_batch(FIT, 50 * MiB, 0.05) == 0


def test_a_tiny_slope_is_capped_not_overflowed() -> None:
    tiny = AffineFit(fixed_bytes=0, bytes_per_sample=1e-300, points=2)
    assert estimate_max_micro_batch(tiny, 2**40, 0.05, size_cap=4096) == 4096


@pytest.mark.parametrize(
    ("fit", "headroom", "message"),
    [
        (AffineFit(fixed_bytes=1, bytes_per_sample=0, points=2), 0.05, "no positive bytes"),
        (FIT, 1.0, "outside"),
    ],
)
def test_unusable_fits_and_headrooms_are_refused(
    fit: AffineFit, headroom: float, message: str
) -> None:
    with pytest.raises(BadInputError, match=message):
        estimate_max_micro_batch(fit, 800 * MiB, headroom)


@given(
    fixed=st.integers(0, 2**34),
    slope=st.integers(1, 2**30),
    capacity=st.integers(1, 2**40),
    headroom=st.floats(0, 0.5),
)
def test_the_estimate_fits_and_one_more_would_not(
    fixed: int, slope: int, capacity: int, headroom: float
) -> None:
    fit = AffineFit(fixed_bytes=fixed, bytes_per_sample=slope, points=2)
    budget = (1 - headroom) * capacity
    m = estimate_max_micro_batch(fit, capacity, headroom, size_cap=10**6)
    if m > 0:
        assert fit.predict(m) <= budget
    if m < 10**6:
        assert fit.predict(m + 1) > budget


def test_an_estimated_recommendation_is_marked_and_has_no_speed() -> None:
    plan = recommend_estimated(
        FIT, capacity_bytes=800 * MiB, headroom=0.05, global_batch_size=128, policy="max"
    )
    assert (plan.basis, plan.max_micro_batch_size, plan.flat_split()) == ("estimated", 66, [66, 62])
    assert plan.expected_peak_bytes == 760 * MiB
    assert plan.expected_headroom_bytes == 40 * MiB
    assert plan.expected_samples_per_second is None


def test_a_measured_recommendation_reports_headroom_from_the_capacity() -> None:
    probes = [sample_probe(m, fits=m <= 8) for m in (1, 8, 9)]
    plan = recommend_measured(
        max_micro_batch_size=8, probes=probes, capacity_bytes=400 * MiB, global_batch_size=16
    )
    assert (plan.basis, plan.flat_split()) == ("measured", [8, 8])
    assert plan.expected_peak_bytes == 180 * MiB
    assert plan.expected_headroom_bytes == 220 * MiB


@pytest.mark.parametrize(
    ("m_star", "oom", "message"),
    [
        (0, None, "not even a micro batch of 1 fits on this device"),
        (8, 1, "running out of memory at micro batch 1"),
    ],
)
def test_nothing_left_says_what_to_do(m_star: int, oom: int | None, message: str) -> None:
    with pytest.raises(NothingFitsError, match=message):
        recommend_measured(
            max_micro_batch_size=m_star, probes=[], global_batch_size=8, oom_limit=oom
        )
    with pytest.raises(NothingFitsError, match="profile the workload on this device"):
        recommend_estimated(FIT, capacity_bytes=50 * MiB, headroom=0.05, global_batch_size=8)
