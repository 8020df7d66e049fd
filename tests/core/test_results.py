"""tuner.core.results: the affine fit and the probe and profile records."""

from __future__ import annotations

import pytest

from tuner.core.results import AffineFit, ProbeResult


def test_fit_through_exact_points_recovers_the_line() -> None:
    fit = AffineFit.through([(1, 1100), (5, 1500), (9, 1900)])
    assert fit is not None
    assert fit.fixed_bytes == pytest.approx(1000)
    assert fit.bytes_per_sample == pytest.approx(100)
    assert fit.points == 3
    assert fit.predict(20) == pytest.approx(3000)


def test_fit_needs_two_distinct_sizes() -> None:
    assert AffineFit.through([]) is None
    assert AffineFit.through([(4, 100), (4, 120)]) is None


def test_largest_fitting_is_the_floor_of_the_prediction_and_never_negative() -> None:
    fit = AffineFit(fixed_bytes=1000, bytes_per_sample=100, points=2)
    assert fit.largest_fitting(1000 + 100 * 37) == 37
    assert fit.largest_fitting(1000 + 100 * 37 + 99) == 37
    assert fit.largest_fitting(500) == 0


def test_largest_fitting_refuses_a_flat_fit() -> None:
    with pytest.raises(ValueError, match="non-positive slope"):
        AffineFit(fixed_bytes=1000, bytes_per_sample=0, points=2).largest_fitting(5000)


def test_footprint_adds_memory_outside_torch_to_the_reserved_peak() -> None:
    probe = ProbeResult(
        micro_batch_size=2,
        fits=True,
        peak_allocated_bytes=900,
        peak_reserved_bytes=1000,
        non_torch_bytes=300,
    )
    assert probe.peak_bytes == 1000
    assert probe.footprint_bytes == 1300
    assert ProbeResult(micro_batch_size=2, fits=False, oom=True).footprint_bytes is None
    # peak_bytes is part of the stored form, for readers that never load the model class.
    assert probe.model_dump()["peak_bytes"] == 1000


def test_probe_results_are_frozen_and_refuse_unknown_fields() -> None:
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        ProbeResult(micro_batch_size=0, fits=False)
    with pytest.raises(ValueError, match="Extra inputs"):
        ProbeResult(micro_batch_size=1, fits=True, colour="red")  # type: ignore[call-arg]


def test_a_profile_reads_back_from_the_json_the_cli_prints() -> None:
    from tests.api.documents import sample_profile
    from tuner.core.results import Profile

    profile = sample_profile()
    printed = profile.model_dump_json()
    assert '"peak_bytes"' in printed  # derived, printed for people and tools
    assert Profile.model_validate_json(printed) == profile
