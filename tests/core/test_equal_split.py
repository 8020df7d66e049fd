"""Every answer says its step as it runs and carries the best equal split: the headline is
an equation that holds, and the split, the equal split and the headline all add up to the
global batch (issue 45)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.core.plan import POLICIES, Recommendation, Run, recommend
from tuner.core.shape import MeshShape
from tuner.core.speeds import SpeedCurve, TimedSize

_EQUAL = re.compile(
    r"micro batch (\d+) × (\d+) accumulation steps?"
    r"(?: × (\d+) ranks| × (\d+) data-parallel groups of (\d+) ranks)? = global batch (\d+)"
)
_RUNS = re.compile(
    r"(.+) = (\d+) samples a step"
    r"(?: × (\d+) ranks| × (\d+) data-parallel groups of (\d+) ranks)? = global batch (\d+)"
)


def holds(headline: str, mesh: MeshShape) -> int:
    """The global batch ``headline`` states, once each of its equations is checked."""
    equal = _EQUAL.fullmatch(headline)
    if equal is not None:
        micro, steps, ranks, groups, tp, total = equal.groups()
        dp = int(ranks or groups or 1)
        assert (dp, int(tp or 1)) == (mesh.dp, mesh.tp)
        assert int(micro) * int(steps) * dp == int(total), headline
        return int(total)
    runs = _RUNS.fullmatch(headline)
    assert runs is not None, headline
    terms, per_rank, ranks, groups, tp, total = runs.groups()
    samples = 0
    for term in terms.split(" + "):
        count, _, size = term.rpartition("×")
        samples += int(count or 1) * int(size)
    dp = int(ranks or groups or 1)
    assert (dp, int(tp or 1)) == (mesh.dp, mesh.tp)
    assert samples == int(per_rank), headline
    assert int(per_rank) * dp == int(total), headline
    return int(total)


def curve(sizes: list[int], rounds: list[list[float]], optimizer: float = 0.0) -> SpeedCurve:
    return SpeedCurve(
        sizes=[
            TimedSize(micro_batch_size=m, seconds_per_sample=r)
            for m, r in zip(sizes, rounds, strict=True)
        ],
        optimizer_seconds=optimizer,
    )


@st.composite
def answers(draw: st.DrawFn) -> tuple[Recommendation, MeshShape]:
    tp = draw(st.sampled_from([1, 1, 2]))
    dp = draw(st.integers(1, 4))
    mesh = MeshShape(dp * tp, tp)
    per_rank = draw(st.integers(1, 600))
    m_star = draw(st.integers(1, 300))
    speeds = None
    if draw(st.booleans()):
        sizes = sorted({max(1, m_star // 2**j) for j in range(4)})
        rounds = draw(st.integers(1, 3))
        per_round = st.lists(st.floats(1e-4, 1e-2), min_size=rounds, max_size=rounds)
        speeds = curve(sizes, [draw(per_round) for _ in sizes], draw(st.floats(0, 0.05)))
    answer = recommend(
        max_micro_batch_size=m_star,
        probes=(),
        global_batch_size=per_rank * dp,
        mesh=mesh,
        policy=draw(st.sampled_from(POLICIES)),
        speeds=speeds,
    )
    return answer, mesh


@given(answers())
def test_headline_split_and_equal_split_add_up_to_the_global_batch(
    found: tuple[Recommendation, MeshShape],
) -> None:
    answer, mesh = found
    batch = answer.global_batch_size
    assert holds(answer.headline, mesh) == batch
    assert sum(size * count for size, count in answer.split) * mesh.dp == batch
    equal = answer.equal
    assert equal.micro_batch_size * equal.grad_accum * mesh.dp == batch
    assert equal.micro_batch_size <= min(answer.max_micro_batch_size, answer.per_rank_batch_size)
    assert holds(equal.headline, mesh) == batch
    if answer.policy == "even" or answer.is_equal:
        assert answer.split == [Run(equal.micro_batch_size, equal.grad_accum)]
    for near in equal.nearby:
        assert near.global_batch_size != batch
        assert near.micro_batch_size * near.grad_accum * mesh.dp == near.global_batch_size
    # What a document says is what the answer is: the headline cannot be sent wrong.
    sent = answer.model_dump(mode="json")
    sent["headline"] = "micro batch 1 × 1 accumulation step = global batch 1"
    assert Recommendation.model_validate(sent).headline == answer.headline


def test_an_uneven_split_is_never_shown_as_its_largest_micro_batch_times_its_count() -> None:
    # The example: 15 × 9 × 2 = 270 is not the 256 the split holds.
    answer = recommend(max_micro_batch_size=15, probes=(), global_batch_size=256, mesh=MeshShape(2))
    assert answer.split == [(15, 2), (14, 7)]
    assert answer.headline == "2×15 + 7×14 = 128 samples a step × 2 ranks = global batch 256"
    assert answer.describe() == answer.headline
    assert answer.equal.headline == (
        "micro batch 8 × 16 accumulation steps × 2 ranks = global batch 256"
    )


def test_policy_even_gives_an_equal_split_even_without_speeds() -> None:
    # Was 4 × 15 + 4 at W = 8, B = 512, M* = 15 with no speeds measured.
    answer = recommend(
        max_micro_batch_size=15, probes=(), global_batch_size=512, mesh=MeshShape(8), policy="even"
    )
    assert answer.split == [(8, 8)]
    assert (answer.equal.micro_batch_size, answer.equal.grad_accum) == (8, 8)
    assert answer.equal.slower_by == 0.0
    assert answer.equal.warning is None


@pytest.mark.parametrize(
    ("batch", "equal", "nearby"),
    [
        # 5 × 50 and 5 × 51 are within 10% of 4 micro batches at this speed; 253 = 11 × 23
        # is not.
        (251, (1, 251), [250, 252]),
        (254, (2, 127), [252, 255]),
        (256, (64, 4), []),
    ],
)
def test_a_batch_without_a_good_divisor_warns_with_batches_that_split_well(
    batch: int, equal: tuple[int, int], nearby: list[int]
) -> None:
    # The Lightning module of the issue: M* = 76, timed at the splits of its batch; a micro
    # batch costs 10 ms and 2 ms a sample.
    sizes = [1, 7, 15, 31, 62, 63, 64]
    rounds = [[(0.01 + 0.002 * m) / m * f for f in (1.0, 1.01, 1.02)] for m in sizes[1:]]
    timed = curve(sizes[1:], rounds, optimizer=0.05)
    answer = recommend(max_micro_batch_size=76, probes=(), global_batch_size=batch, speeds=timed)
    assert (answer.equal.micro_batch_size, answer.equal.grad_accum) == equal
    if not nearby:
        assert answer.equal.warning is None
        assert answer.equal.slower_by == 0.0
        return
    assert answer.equal.slower_by is not None
    assert answer.equal.slower_by > 0.5
    assert answer.equal.speed_basis == "estimated"  # below the smallest size timed
    assert answer.equal.warning is not None
    assert [n.global_batch_size for n in answer.equal.nearby] == nearby
    assert all(n.expected_samples_per_second for n in answer.equal.nearby)
    for near in nearby:
        assert f"global batch {near} splits well" in answer.equal.warning


def test_an_answer_kept_by_an_earlier_version_gets_its_equal_split() -> None:
    answer = recommend(max_micro_batch_size=15, probes=(), global_batch_size=100)
    old = answer.model_dump(mode="json")
    del old["equal"], old["headline"]
    again = Recommendation.model_validate(old)
    assert (again.equal.micro_batch_size, again.equal.grad_accum) == (10, 10)
    assert again.headline == answer.headline


def test_the_nearest_good_batch_below_may_take_fewer_micro_batches() -> None:
    # 2**20 − 3 is prime; 2**20 − 4 = 76 × 13,797 runs one micro batch fewer than the batch.
    answer = recommend(max_micro_batch_size=76, probes=(), global_batch_size=2**20 - 3)
    assert [
        (n.global_batch_size, n.micro_batch_size, n.grad_accum) for n in answer.equal.nearby
    ] == [
        (2**20 - 4, 76, 13_797),
        (76 * 13_798, 76, 13_798),
    ]
