"""The speed curve (tuner.core.speeds) and the split the answer takes by it
(tuner.core.plan.fastest_balanced)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from tuner.core.plan import balanced_runs, recommend
from tuner.core.speeds import SpeedCurve, TimedSize


def curve(per_sample: dict[int, list[float]], optimizer: float = 0.0) -> SpeedCurve:
    return SpeedCurve(
        sizes=[TimedSize(micro_batch_size=m, seconds_per_sample=s) for m, s in per_sample.items()],
        optimizer_seconds=optimizer,
    )


def test_a_step_is_its_samples_times_the_per_sample_time_plus_one_optimizer_step() -> None:
    timed = curve({8: [0.010, 0.011], 16: [0.008, 0.009], 64: [0.006, 0.007]}, optimizer=0.5)
    assert timed.step_seconds([(64, 4)]) == pytest.approx(256 * 0.006 + 0.5)
    # 40 lies between 16 and 64: linear in the size, from the fastest rounds.
    assert timed.seconds_per_sample(40) == pytest.approx(0.008 + (24 / 48) * (0.006 - 0.008))
    assert timed.samples_per_second([(16, 16)]) == pytest.approx(256 / (256 * 0.008 + 0.5))


def test_the_curve_never_extrapolates() -> None:
    timed = curve({8: [0.01], 64: [0.006]})
    assert timed.seconds_per_sample(7) is None
    assert timed.seconds_per_sample(65) is None
    assert timed.step_seconds([(65, 3), (61, 1)]) is None


def test_a_size_spread_is_how_far_its_rounds_lie_apart() -> None:
    timed = curve({8: [0.010, 0.0125], 64: [0.006, 0.006]})
    assert timed.sizes[0].spread == pytest.approx(0.2)
    assert timed.spread([(64, 4)]) == 0.0
    # A size between two timed ones leans on both: the larger spread counts.
    assert timed.spread([(32, 8)]) == pytest.approx(0.2)


def test_curves_that_describe_no_measurement_are_refused() -> None:
    with pytest.raises(ValidationError, match="smallest first"):
        curve({64: [0.01], 8: [0.01]})
    with pytest.raises(ValidationError, match="positive finite"):
        curve({8: [0.0]})
    with pytest.raises(ValidationError):
        curve({m: [0.01] for m in range(1, 18)})  # more sizes than a profile keeps


def test_without_a_curve_balanced_is_the_fewest_micro_batches() -> None:
    answer = recommend(max_micro_batch_size=65, probes=(), global_batch_size=256)
    assert answer.split == [(64, 4)]
    assert answer.expected_speed_spread is None


def test_a_split_faster_by_more_than_the_spread_is_the_answer_and_says_so() -> None:
    # As timed on the Quickstart's GPT: 16 × 16 well ahead of 64 × 4, rounds tight.
    timed = curve(
        {8: [0.0075, 0.0076], 16: [0.0056, 0.0057], 32: [0.0062, 0.0063], 64: [0.0069, 0.0070]},
        optimizer=0.01,
    )
    answer = recommend(max_micro_batch_size=65, probes=(), global_batch_size=256, speeds=timed)
    assert answer.split == [(16, 16)]
    assert answer.reason.startswith("balanced, timed: 16 micro batches of 16 train ")
    assert "over 2 paired timed rounds" in answer.reason
    assert "with 95% confidence" in answer.reason
    assert answer.expected_samples_per_second == pytest.approx(256 / (256 * 0.0056 + 0.01))
    assert answer.expected_speed_spread == pytest.approx(1 - 0.0056 / 0.0057)


def test_a_gain_the_paired_rounds_do_not_show_keeps_the_fewest_and_says_why() -> None:
    # 16 and 32 ran faster than 64 in the first round and slower in the second.
    timed = curve({16: [0.0060, 0.0080], 32: [0.0066, 0.0071], 64: [0.0068, 0.0069]})
    answer = recommend(max_micro_batch_size=65, probes=(), global_batch_size=256, speeds=timed)
    assert answer.split == [(64, 4)]
    assert "do not show with 95% confidence" in answer.reason


def test_a_loaded_machine_never_picks_a_split_by_its_noise() -> None:
    # The busy machine: the best rounds put 9 far ahead (29.4 against 9.6 to 15.8
    # samples/s) but each size met the load in another round, so the pairs disagree.
    timed = curve(
        {
            4: [1 / 9.6, 1 / 3.1, 1 / 5.0],
            9: [1 / 29.4, 1 / 3.5, 1 / 4.2],
            18: [1 / 14.6, 1 / 6.0, 1 / 14.0],
            36: [1 / 4.1, 1 / 15.8, 1 / 12.0],
            37: [1 / 3.3, 1 / 12.8, 1 / 12.5],
        }
    )
    answer = recommend(max_micro_batch_size=37, probes=(), global_batch_size=256, speeds=timed)
    assert answer.grad_accum == 7  # the fewest that fit: 4×37 + 3×36
    assert "do not show with 95% confidence" in answer.reason


def test_one_timed_round_states_no_confidence() -> None:
    timed = curve({16: [0.004], 64: [0.006]})
    answer = recommend(max_micro_batch_size=65, probes=(), global_batch_size=256, speeds=timed)
    assert answer.split == [(64, 4)]
    assert "one timed round states no confidence" in answer.reason


def test_the_fewest_when_it_is_also_the_fastest() -> None:
    timed = curve({16: [0.009], 32: [0.008], 64: [0.006]})
    answer = recommend(max_micro_batch_size=65, probes=(), global_batch_size=256, speeds=timed)
    assert answer.split == [(64, 4)]
    assert "also the fastest of the splits timed" in answer.reason


def test_other_policies_do_not_take_the_curve_split() -> None:
    timed = curve({16: [0.001], 64: [0.006]})
    answer = recommend(
        max_micro_batch_size=65, probes=(), global_batch_size=256, policy="max", speeds=timed
    )
    assert answer.split == [(65, 3), (61, 1)]


@given(
    per_rank=st.integers(1, 5000),
    m_star=st.integers(1, 600),
    times=st.lists(st.floats(1e-4, 1e-1), min_size=1, max_size=6),
)
def test_the_curve_answer_always_fits_and_keeps_the_batch(
    per_rank: int, m_star: int, times: list[float]
) -> None:
    sizes = sorted({max(1, m_star // 2**j) for j in range(len(times))})
    timed = curve({m: [t] for m, t in zip(sizes, times, strict=False)})
    answer = recommend(
        max_micro_batch_size=m_star, probes=(), global_batch_size=per_rank, speeds=timed
    )
    assert answer.per_rank_batch_size == per_rank
    assert all(size <= m_star for size, _ in answer.split)
    # Balanced in every case: sizes within one of each other.
    assert max(s for s, _ in answer.split) - min(s for s, _ in answer.split) <= 1
    fewest = balanced_runs(per_rank, min(m_star, per_rank))
    assert answer.grad_accum >= sum(count for _, count in fewest)
