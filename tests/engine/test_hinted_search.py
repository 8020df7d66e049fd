"""tuner.engine.search.hinted: a search aimed by a predicted M* is exactly as exact as
bisection, whatever the guess, and takes two probes when the guess is right or one high."""

from __future__ import annotations

import pytest

from tests.curves import Curve, affine, steps, two_phases
from tests.engine.limits import limit_with_m_star
from tuner.engine.backends import CpuBackend
from tuner.engine.probe import Prober
from tuner.engine.search import SearchOutcome, SearchRecorder, bisect_search, hinted_search
from tuner.engine.search.strategies import continue_with_model
from tuner.engine.workload import load_workload

MiB = 2**20
CAP = 512


def curves() -> dict[str, Curve]:
    """Fresh curves (they record their calls): affine with a breakdown, allocator steps,
    two phases with the optimizer binding, and one whose peaks fail as OOMs."""
    footprint, phases = two_phases(affine(40 * MiB, 2 * MiB), affine(150 * MiB, 1000))
    return {
        "affine": Curve(affine(30 * MiB, MiB, granule=2**16), 200 * MiB, resident=30 * MiB),
        "steps": Curve(steps(10 * MiB, width=4, height=3 * MiB), 100 * MiB),
        "two phases": Curve(footprint, 149 * MiB, phases=phases),
        "oom above": Curve(affine(5 * MiB, MiB), 60 * MiB, capacity=62 * MiB, resident=5 * MiB),
    }


def run_hinted(curve: Curve, guess: int, cap: int = CAP) -> SearchOutcome:
    return hinted_search(curve, cap=cap, budget_bytes=curve.budget, guess=guess)


def guesses(m_star: int) -> dict[str, int]:
    return {
        "exact": m_star,
        "one high": m_star + 1,
        "one low": m_star - 1,
        "far high": 3 * m_star + 7,
        "far low": max(1, m_star // 3),
        "above the cap": CAP + 100,
        "zero": 0,
        "negative": -5,
    }


@pytest.mark.parametrize("name", list(curves()))
@pytest.mark.parametrize("kind", list(guesses(1)))
def test_hinted_search_is_exact_whatever_the_guess(name: str, kind: str) -> None:
    curve = curves()[name]
    expected = curve.brute_force(CAP)
    outcome = run_hinted(curve, guesses(expected)[kind])
    sizes = [p.micro_batch_size for p in outcome.probes]
    assert outcome.max_micro_batch_size == expected, sizes
    assert sizes == curve.calls  # the outcome lists exactly the probes that ran
    assert len(set(sizes)) == len(sizes)  # never the same size twice
    assert outcome.probes[0].micro_batch_size == min(max(guesses(expected)[kind], 1), CAP)
    bisected = bisect_search(curves()[name], cap=CAP, budget_bytes=curve.budget)
    assert bisected.max_micro_batch_size == expected


@pytest.mark.parametrize("offset", [0, 1])
def test_a_guess_right_or_one_high_takes_two_probes(offset: int) -> None:
    curve = curves()["affine"]
    expected = curve.brute_force(CAP)
    outcome = run_hinted(curve, expected + offset)
    assert [p.micro_batch_size for p in outcome.probes] == (
        [expected, expected + 1] if offset == 0 else [expected + 1, expected]
    )


def test_the_cap_and_nothing_fitting_are_answered_exactly() -> None:
    roomy = Curve(affine(MiB, MiB), 1000 * MiB)
    assert [p.micro_batch_size for p in run_hinted(roomy, 50, cap=8).probes] == [8]
    assert run_hinted(roomy, 50, cap=8).max_micro_batch_size == 8
    full = Curve(affine(100 * MiB, MiB), 50 * MiB)
    outcome = run_hinted(full, 20)
    assert outcome.max_micro_batch_size == 0
    assert [p.micro_batch_size for p in outcome.probes][-1] == 1


def test_continuing_needs_a_size_that_fits() -> None:
    search = SearchRecorder(Curve(affine(0, 10), budget=50), cap=10)
    search.run(8)  # fails: nothing to aim from
    with pytest.raises(ValueError, match="from a size that fits"):
        continue_with_model(search, budget_bytes=50)


@pytest.mark.slow
def test_hinted_search_on_a_real_tiny_model_matches_bisection() -> None:
    """A real GPT block on the CPU backend with M* = 12: every guess lands on the same
    answer as bisection, and a right guess costs two probes."""
    workload = load_workload(
        "examples.gpt:workload", {"vocab": 64, "dim": 16, "layers": 1, "heads": 2, "seq_len": 16}
    )
    limit = limit_with_m_star(workload, 12)
    with Prober(workload, CpuBackend(limit), headroom=0.05) as prober:
        budget = prober.budget_bytes
        bisected = bisect_search(prober, cap=64, budget_bytes=budget)
        assert bisected.max_micro_batch_size == 12
        for guess in (12, 13, 11, 40, 3, 0, 100):
            outcome = hinted_search(prober, cap=64, budget_bytes=budget, guess=guess)
            assert outcome.max_micro_batch_size == 12, (guess, outcome.probes)
            if guess in (12, 13):
                assert len(outcome.probes) == 2
