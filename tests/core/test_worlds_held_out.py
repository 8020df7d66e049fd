"""Estimates for a world size never measured keep the fit's error on each probe left out of
it as their margin (torch-free): on a curve with a term the fit lacks they stay at most the
true M*, and a fit that passes through every probe does not answer between them."""

from __future__ import annotations

import pytest

from tests.api.documents import MiB, profile_with_peaks
from tuner.core.errors import BadInputError
from tuner.core.parallel import Parallel
from tuner.core.results import Profile
from tuner.core.shape import MeshShape
from tuner.core.worlds import estimate_world_size, fit_world_sizes

FIXED, SLOPE, SHARDED = 20 * MiB, 2 * MiB, 120 * MiB
BUDGET = int(0.95 * 200 * MiB) - 12_345


def peak(m: int, world_size: int, curve: float) -> int:
    # ``curve / W²``: a term the fit (1, m, 1/W) lacks.
    return int(FIXED + SLOPE * m + SHARDED / world_size + curve / world_size**2)


def true_max(world_size: int, curve: float) -> int:
    return max(m for m in range(1, 500) if peak(m, world_size, curve) <= BUDGET)


def measured(world_size: int, curve: float, sizes: set[int] | None = None) -> Profile:
    best = true_max(world_size, curve)
    chosen = {best // 2, best, best + 1} if sizes is None else sizes | {best}
    peaks = {m: peak(m, world_size, curve) for m in chosen}
    return profile_with_peaks(
        best, peaks, BUDGET, world_size=world_size, parallel=Parallel(mode="fsdp")
    )


@pytest.mark.parametrize("curve", [-60 * MiB, 40 * MiB])
def test_with_a_term_the_fit_lacks_the_estimate_is_at_most_the_truth(curve: float) -> None:
    profiles = [measured(1, curve), measured(2, curve), measured(8, curve)]
    fit = fit_world_sizes(profiles)
    assert fit.held_out_error is not None
    assert fit.error_bound == max(fit.max_relative_error, fit.held_out_error)
    assert fit.held_out_error > fit.max_relative_error
    for world_size in (3, 4, 5, 6, 16):
        estimate = estimate_world_size(profiles, MeshShape(world_size))
        assert estimate.max_micro_batch_size <= true_max(world_size, curve), world_size


def test_a_fit_through_every_probe_does_not_answer_between_them() -> None:
    # One probe near each boundary: the fit (1, m) passes through both, and no probe can
    # be left out of it.
    curve = 40 * MiB
    profiles = [measured(1, curve, set()), measured(4, curve, set())]
    fit = fit_world_sizes(profiles)
    assert fit.max_relative_error < 1e-9
    assert fit.held_out_error is None
    with pytest.raises(BadInputError, match="cannot know its error") as caught:
        estimate_world_size(profiles, MeshShape(2))
    assert "--world-size 2" in str(caught.value)
    # Above every measured size the largest one's M* bounds it from below: it answers.
    above = estimate_world_size(profiles, MeshShape(8))
    assert above.max_micro_batch_size <= true_max(8, curve)
