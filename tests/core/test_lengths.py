"""Peak memory across sequence lengths: the fit ``a₀ + a₁·s + b·m·s + c·m·s²`` (torch-free)
on exact synthetic peaks, with and without the quadratic term, and the estimates it
allows between and just beyond measured lengths."""

from __future__ import annotations

import pytest

from tests.api.documents import MiB, profile_with_peaks
from tuner.core.errors import BadInputError
from tuner.core.lengths import EXTRAPOLATION, estimate_length, fit_lengths
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
