"""Estimates for a world size never measured: the fit of peak per rank against m and 1/W
(torch-free), on exact synthetic peaks and on noisy ones."""

from __future__ import annotations

import pytest

from tests.api.documents import MiB, profile_with_peaks
from tuner.core.errors import BadInputError
from tuner.core.parallel import Parallel
from tuner.core.results import Profile
from tuner.core.shape import MeshShape
from tuner.core.worlds import estimate_world_size, fit_world_sizes

FIXED, SLOPE, SHARDED = 20 * MiB, 2 * MiB, 120 * MiB
BUDGET = int(0.95 * 200 * MiB) - 12_345  # no size lands exactly on it


def peak(m: int, world_size: int, noise: float = 0.0) -> int:
    return int((FIXED + SLOPE * m + SHARDED / world_size) * (1 + noise))


def true_max(world_size: int) -> int:
    return max(m for m in range(1, 500) if peak(m, world_size) <= BUDGET)


def measured(world_size: int, noise: float = 0.0) -> Profile:
    """A profile as a search at ``world_size`` leaves it: sizes around the true M*."""
    best = true_max(world_size)
    sizes = sorted({1, best // 2, best, best + 1})
    # Alternate signs of the noise, so that the fit cannot absorb it into one term.
    peaks = {m: peak(m, world_size, noise if i % 2 else -noise) for i, m in enumerate(sizes)}
    return profile_with_peaks(
        best, peaks, BUDGET, world_size=world_size, parallel=Parallel(mode="fsdp")
    )


def test_exact_peaks_give_the_terms_and_the_exact_m_star_between_measured_sizes() -> None:
    profiles = [measured(1), measured(2), measured(4)]
    fit = fit_world_sizes(profiles)
    phase = fit.phases["accumulate"]
    assert phase.fixed_bytes == pytest.approx(FIXED, rel=1e-6)
    assert phase.per_sample_bytes == pytest.approx(SLOPE, rel=1e-6)
    assert phase.sharded_bytes == pytest.approx(SHARDED, rel=1e-6)
    assert fit.max_relative_error < 1e-6
    estimate = estimate_world_size(profiles, MeshShape(3))
    assert estimate.max_micro_batch_size == true_max(3)
    assert estimate.basis == "estimated"
    assert estimate.based_on == [1, 2, 4]
    assert "estimated from world sizes 1, 2, 4" in estimate.describe()


@pytest.mark.parametrize("noise", [0.002, 0.01])
def test_with_noise_the_answer_is_exact_or_below_never_above(noise: float) -> None:
    profiles = [measured(1, noise), measured(2, noise), measured(4, noise)]
    estimate = estimate_world_size(profiles, MeshShape(3))
    assert true_max(3) - 2 <= estimate.max_micro_batch_size <= true_max(3)
    assert estimate.fit.max_relative_error == pytest.approx(noise, rel=0.5)


def test_never_above_what_was_measured_to_fit_at_the_next_larger_world_size() -> None:
    profiles = [measured(1), measured(2)]
    # Above every measured size, the largest one that ran is the ceiling.
    assert estimate_world_size(profiles, MeshShape(8)).max_micro_batch_size == true_max(2)
    # A measured world size is answered by its own profile.
    same = estimate_world_size(profiles, MeshShape(1))
    assert same.max_micro_batch_size == true_max(1)
    assert same.basis == "measured"


def test_profiles_that_cannot_be_combined_are_refused_in_one_line() -> None:
    with pytest.raises(BadInputError, match="two or more world sizes"):
        fit_world_sizes([measured(2)])
    other = measured(4).model_copy(update={"parallel": Parallel(mode="ddp")})
    with pytest.raises(BadInputError, match="differ in parallel mode"):
        fit_world_sizes([measured(2), other])
    with pytest.raises(BadInputError, match="world size must be a positive integer"):
        estimate_world_size([measured(1), measured(2)], MeshShape(0))
