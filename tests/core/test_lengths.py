"""Peak memory across sequence lengths: the fit ``a₀ + a₁·s + b·m·s + c·m·s²`` (torch-free)
on exact synthetic peaks, with and without the quadratic term, and the estimates it
allows between and just beyond measured lengths; on a curve with a term the fit lacks,
estimates at most the truth (the fit's error learned by leaving each point out) or none."""

from __future__ import annotations

import pytest

from tests.api.documents import MiB, profile_with_peaks
from tuner.core.errors import BadInputError
from tuner.core.lengths import (
    EXTRAPOLATION,
    estimate_length,
    fit_length_profiles,
    fit_lengths,
    held_out_error,
)
from tuner.core.parallel import Parallel
from tuner.core.results import Profile
from tuner.core.shape import MeshShape

FIXED, PER_POSITION, PER_TOKEN, PER_PAIR = 30 * MiB, 4096, 2048, 24
BUDGET = int(0.95 * 400 * MiB) - 12_345  # no size lands exactly on it


def peak(m: int, s: int, pair: float = PER_PAIR) -> int:
    return int(FIXED + PER_POSITION * s + PER_TOKEN * m * s + pair * m * s * s)


def true_max(s: int, pair: float = PER_PAIR) -> int:
    return max(m for m in range(1, 5000) if peak(m, s, pair) <= BUDGET)


def measured(s: int, pair: float = PER_PAIR) -> Profile:
    """A profile at length ``s`` as a search leaves it: sizes around the true M*."""
    best = true_max(s, pair)
    sizes = {best // 2, best - 1, best, best + 1}
    return profile_with_peaks(best, {m: peak(m, s, pair) for m in sizes}, BUDGET, size_cap=4096)


def test_three_lengths_recover_every_term() -> None:
    points = [(m, s, peak(m, s)) for s in (128, 256, 512) for m in (1, 8, 32)]
    fit = fit_lengths(points)
    assert fit.fixed_bytes == pytest.approx(FIXED, rel=1e-6)
    assert fit.fixed_per_token_bytes == pytest.approx(PER_POSITION, rel=1e-4)
    assert fit.per_token_bytes == pytest.approx(PER_TOKEN, rel=1e-6)
    assert fit.per_token_pair_bytes == pytest.approx(PER_PAIR, rel=1e-6)
    assert fit.max_relative_error < 1e-9


def test_without_a_quadratic_term_it_is_fitted_as_zero_never_assumed() -> None:
    points = [(m, s, peak(m, s, pair=0)) for s in (128, 256, 512) for m in (1, 8, 32)]
    fit = fit_lengths(points)
    assert fit.per_token_pair_bytes == pytest.approx(0, abs=1e-6)
    # Noise that makes c slightly negative: c is set to zero and the rest refitted.
    noisy = [(m, s, int(y * (1 - 1e-4 * (s == 512 and m == 32)))) for m, s, y in points]
    fit = fit_lengths(noisy)
    assert fit.per_token_pair_bytes == 0
    assert fit.per_token_bytes == pytest.approx(PER_TOKEN, rel=1e-3)


def test_a_held_out_length_is_estimated_exactly_or_one_below_never_above() -> None:
    lengths = [128, 256, 512]
    profiles = [measured(s) for s in lengths]
    for held_out in (192, 384, 600):  # between, between, and 17% beyond the longest
        answer = estimate_length(profiles, lengths, held_out)
        assert answer.basis == "estimated"
        assert answer.based_on == lengths
        assert true_max(held_out) - 1 <= answer.max_micro_batch_size <= true_max(held_out)
        assert answer.tokens_per_micro_batch == answer.max_micro_batch_size * held_out
        want = peak(answer.max_micro_batch_size, held_out)
        assert answer.expected_peak_bytes == pytest.approx(want, rel=0.02)
        assert "estimated for seq_len" in answer.describe()


def test_a_measured_length_answers_from_its_own_profile() -> None:
    lengths = [128, 256]
    answer = estimate_length([measured(s) for s in lengths], lengths, 256)
    assert answer.basis == "measured"
    assert answer.max_micro_batch_size == true_max(256)
    assert answer.fit is None


def test_measured_answers_bound_the_estimate() -> None:
    # Two lengths cannot see the quadratic term: the fit underestimates memory between
    # them, but never past the measured M* of the shorter one.
    lengths = [128, 512]
    profiles = [measured(s) for s in lengths]
    answer = estimate_length(profiles, lengths, 300)
    assert true_max(512) <= answer.max_micro_batch_size <= true_max(128)


def test_lengths_too_far_from_the_measured_ones_are_refused_in_one_line() -> None:
    lengths = [128, 256]
    profiles = [measured(s) for s in lengths]
    too_long = int(256 * EXTRAPOLATION) + 1
    with pytest.raises(BadInputError, match=f"seq_len {too_long} is too far") as caught:
        estimate_length(profiles, lengths, too_long)
    assert "--seq-lens 128,256,321" in str(caught.value)
    with pytest.raises(BadInputError, match="too far"):
        estimate_length(profiles, lengths, 63)
    with pytest.raises(BadInputError, match="two or more lengths"):
        fit_lengths([(1, 128, 10), (2, 128, 20)])
    with pytest.raises(BadInputError, match="one sequence length per profile"):
        estimate_length(profiles, [128], 200)


def test_profiles_at_two_mesh_shapes_of_one_world_size_are_not_fitted_together() -> None:
    # Four ranks as 4 × 1 and as 2 × 2 hold different shares of the model: one length fit
    # across them would mix two curves. The world size alone cannot tell them apart.
    flat = Parallel(mode="fsdp", tp_plan="llama")
    mesh = Parallel(mode="fsdp", tp=2, tp_plan="llama")
    profiles = [
        measured(128).model_copy(update={"world_size": 4, "parallel": flat}),
        measured(256).model_copy(update={"world_size": 4, "parallel": mesh}),
    ]
    assert [p.mesh for p in profiles] == [MeshShape(4), MeshShape(4, 2)]
    with pytest.raises(BadInputError, match="differ in device, budget or mesh shape"):
        estimate_length(profiles, [128, 256], 200)


# A curve with a term the fit lacks (m·s³): exact through as many points as it has terms,
# wrong between them, as XLM-RoBERTa's was (a residual of 1e-15, 7 answered where 6 fit).
CUBE = 0.05


def cubic_peak(m: int, s: int, cube: float = CUBE) -> int:
    return int(peak(m, s) + cube * m * s**3)


def cubic_max(s: int, cube: float = CUBE) -> int:
    return max(m for m in range(1, 5000) if cubic_peak(m, s, cube) <= BUDGET)


def cubic_profile(s: int, sizes: set[int], cube: float = CUBE) -> Profile:
    best = cubic_max(s, cube)
    peaks = {m: cubic_peak(m, s, cube) for m in sizes | {best}}
    return profile_with_peaks(best, peaks, BUDGET, size_cap=4096)


def test_a_fit_through_every_point_knows_no_error_and_estimates_nothing() -> None:
    lengths = [64, 128, 256]
    # Two peaks at the first length, one at each later one (a right guess): four points,
    # four terms.
    profiles = [
        cubic_profile(64, {(cubic_max(64) + 1) // 2}),
        cubic_profile(128, set()),
        cubic_profile(256, set()),
    ]
    fit = fit_length_profiles(profiles, lengths)
    assert fit.points == 4
    assert fit.max_relative_error < 1e-9  # through every point...
    assert fit.held_out_error is None  # ... and no point can be left out of it
    # Its residual as the margin would answer above the truth between the lengths.
    per_sample, fixed = fit.per_sample_bytes(160), fit.predict(0, 160)
    assert int((BUDGET - fixed) // per_sample) > cubic_max(160)
    for seq_len in (96, 160, 192, 300):
        with pytest.raises(BadInputError, match="cannot know its error") as caught:
            estimate_length(profiles, lengths, seq_len)
        assert f"--seq-lens {','.join(map(str, sorted({*lengths, seq_len})))}" in str(caught.value)


@pytest.mark.parametrize("cube", [CUBE, 0.1, -0.004])
def test_with_a_term_the_fit_lacks_every_estimate_is_at_most_the_truth(cube: float) -> None:
    lengths = [64, 128, 256]
    # Two peaks at every length (what --seq-lens measures now: one more probe at a
    # length that has one, where the fit would not know its error).
    profiles = [cubic_profile(s, {(cubic_max(s, cube) + 1) // 2}, cube) for s in lengths]
    fit = fit_length_profiles(profiles, lengths)
    assert fit.held_out_error is not None
    assert fit.error_bound == max(fit.max_relative_error, fit.held_out_error)
    assert fit.held_out_error > fit.max_relative_error
    for seq_len in range(40, int(256 * EXTRAPOLATION) + 1, 8):
        answer = estimate_length(profiles, lengths, seq_len)
        assert answer.max_micro_batch_size <= cubic_max(seq_len, cube), seq_len
        if answer.basis == "estimated":
            assert f"within {fit.error_bound:.1%}" in answer.describe()


def test_held_out_error_is_the_worst_prediction_of_a_point_left_out() -> None:
    points = [(m, s, cubic_peak(m, s)) for s in (64, 128, 256) for m in (4, 8)]
    worst = 0.0
    for index, (m, s, y) in enumerate(points):
        others = fit_lengths([*points[:index], *points[index + 1 :]])
        worst = max(worst, abs(others.predict(m, s) - y) / y)
    assert held_out_error(points) == pytest.approx(worst)
    assert fit_lengths(points).held_out_error == pytest.approx(worst)
    # Leaving out the only point at a length, two lengths and one size at the other: none.
    assert held_out_error([(1, 64, 100), (2, 64, 180), (1, 128, 190)]) is None
