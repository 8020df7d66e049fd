"""tuner.core.plan: from M* and measured probes to micro batch, accumulation steps and split."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from tuner.core.errors import BadInputError, NothingFitsError
from tuner.core.plan import (
    DEFAULT_POLICY,
    POLICIES,
    Recommendation,
    Run,
    balanced_split,
    format_runs,
    format_split,
    per_rank_batch,
    recommend,
    runs_of,
    split_batch,
)
from tuner.core.results import ProbeResult
from tuner.core.shape import MeshShape
from tuner.core.speeds import SpeedCurve, TimedSize


def probe(
    size: int, *, fits: bool = True, speed: float | None = None, peak: int = 0
) -> ProbeResult:
    """A measured probe, written out by hand: plain data, the shape a profile stores."""
    return ProbeResult(
        micro_batch_size=size,
        fits=fits,
        peak_allocated_bytes=peak or 1000 * size,
        peak_reserved_bytes=peak or 1000 * size,
        samples_per_second=speed,
    )


@pytest.mark.parametrize(
    ("per_rank", "micro", "expected"),
    [
        (100, 25, [25, 25, 25, 25]),
        (100, 30, [30, 30, 30, 10]),
        (7, 7, [7]),
        (7, 1, [1] * 7),
        (5, 10, [5]),
        (10, 9, [9, 1]),
    ],
)
def test_split_batch_lists_full_micro_batches_then_the_remainder(
    per_rank: int, micro: int, expected: list[int]
) -> None:
    assert split_batch(per_rank, micro) == expected


def test_max_policy_even_split_keeps_the_global_batch() -> None:
    plan = recommend(
        max_micro_batch_size=32, probes=[], global_batch_size=256, mesh=MeshShape(2), policy="max"
    )
    assert (plan.micro_batch_size, plan.grad_accum, plan.flat_split()) == (32, 4, [32] * 4)
    assert plan.per_rank_batch_size == 128
    assert plan.micro_batch_size * plan.grad_accum * plan.world_size == plan.global_batch_size


def test_max_policy_uneven_split_sums_to_the_per_rank_batch() -> None:
    plan = recommend(
        max_micro_batch_size=30, probes=[], global_batch_size=200, mesh=MeshShape(2), policy="max"
    )
    assert plan.flat_split() == [30, 30, 30, 10]
    assert plan.grad_accum == 4
    assert sum(plan.flat_split()) * plan.world_size == 200


def test_m_star_larger_than_per_rank_batch_gives_one_step_of_the_whole_batch() -> None:
    plan = recommend(max_micro_batch_size=4096, probes=[], global_batch_size=96, mesh=MeshShape(4))
    assert (plan.micro_batch_size, plan.grad_accum, plan.flat_split()) == (24, 1, [24])
    assert plan.max_micro_batch_size == 4096


def test_batch_not_divisible_by_world_size_is_refused() -> None:
    with pytest.raises(BadInputError, match="not divisible by world size 3"):
        recommend(max_micro_batch_size=8, probes=[], global_batch_size=100, mesh=MeshShape(3))


@pytest.mark.parametrize(("batch", "world"), [(0, 1), (-8, 1), (8, 0), (8, -2)])
def test_non_positive_batch_or_world_size_is_refused(batch: int, world: int) -> None:
    with pytest.raises(BadInputError, match="positive integer"):
        per_rank_batch(batch, MeshShape(world))


def test_unknown_policy_is_refused_and_lists_the_known_ones() -> None:
    with pytest.raises(BadInputError, match="unknown policy 'fastest'") as info:
        recommend(max_micro_batch_size=8, probes=[], global_batch_size=64, policy="fastest")
    for name in POLICIES:
        assert name in info.value.message


@pytest.mark.parametrize("m_star", [0, -1])
def test_nothing_fits_means_no_recommendation(m_star: int) -> None:
    with pytest.raises(NothingFitsError):
        recommend(max_micro_batch_size=m_star, probes=[], global_batch_size=64)


def test_max_policy_reports_the_measured_probe_at_the_chosen_size() -> None:
    probes = [probe(1, speed=10.0), probe(30, speed=200.0, peak=12345), probe(31, fits=False)]
    plan = recommend(max_micro_batch_size=30, probes=probes, global_batch_size=100, policy="max")
    assert plan.expected_peak_bytes == 12345
    assert plan.expected_samples_per_second == 200.0
    assert plan.basis == "measured"


def test_unmeasured_chosen_size_has_no_expected_numbers() -> None:
    plan = recommend(
        max_micro_batch_size=30, probes=[probe(1)], global_batch_size=100, basis="estimated"
    )
    assert plan.expected_peak_bytes is None
    assert plan.expected_samples_per_second is None
    assert plan.basis == "estimated"


def test_even_policy_takes_the_largest_divisor_that_fits() -> None:
    probes = [probe(30, speed=100.0), probe(25, speed=96.0), probe(20, speed=99.0)]
    plan = recommend(max_micro_batch_size=30, probes=probes, global_batch_size=100, policy="even")
    # 25 is the largest divisor of 100 below 30: the fewest equal micro batches.
    assert plan.flat_split() == [25, 25, 25, 25]
    assert plan.micro_batch_size * plan.grad_accum == 100
    assert plan.equal.micro_batch_size == 25


@pytest.mark.parametrize(
    "probes",
    [
        [probe(30, speed=100.0), probe(25, speed=94.0), probe(10, speed=95.0)],
        [probe(30, speed=100.0), probe(25, speed=50.0), probe(1, speed=1.0)],
        [],
    ],
)
def test_even_policy_is_always_equal_whatever_the_probes_speeds(probes) -> None:
    # A single probe's speed is no comparison of splits: only paired timed rounds are.
    plan = recommend(max_micro_batch_size=30, probes=probes, global_batch_size=100, policy="even")
    assert plan.flat_split() == [25] * 4


def test_even_policy_takes_a_smaller_divisor_only_when_the_paired_rounds_show_it() -> None:
    timed = SpeedCurve(
        sizes=[
            TimedSize(micro_batch_size=10, seconds_per_sample=[0.0050, 0.0052, 0.0051]),
            TimedSize(micro_batch_size=25, seconds_per_sample=[0.0080, 0.0083, 0.0081]),
        ],
        optimizer_seconds=0.0,
    )
    plan = recommend(
        max_micro_batch_size=30, probes=[], global_batch_size=100, policy="even", speeds=timed
    )
    assert plan.flat_split() == [10] * 10
    assert "with 95% confidence" in plan.reason


def test_even_policy_uses_max_when_it_already_divides() -> None:
    probes = [probe(25, speed=1.0), probe(5, speed=1000.0)]
    plan = recommend(max_micro_batch_size=25, probes=probes, global_batch_size=100, policy="even")
    assert plan.micro_batch_size == 25


def test_throughput_policy_picks_the_fastest_fitting_probe_within_the_batch() -> None:
    probes = [
        probe(8, speed=500.0),
        probe(16, speed=900.0),
        probe(32, speed=800.0),
        probe(48, fits=False, speed=5000.0),  # did not fit: never chosen
        probe(64, speed=9999.0),  # above B/W: never chosen
    ]
    plan = recommend(
        max_micro_batch_size=64, probes=probes, global_batch_size=40, policy="throughput"
    )
    assert plan.micro_batch_size == 16
    assert plan.flat_split() == [16, 16, 8]
    assert plan.expected_samples_per_second == 900.0


def test_throughput_policy_without_speeds_falls_back_to_max() -> None:
    plan = recommend(
        max_micro_batch_size=12, probes=[probe(12)], global_batch_size=48, policy="throughput"
    )
    assert plan.micro_batch_size == 12


def test_describe_for_an_even_split_on_one_rank() -> None:
    text = recommend(max_micro_batch_size=32, probes=[], global_batch_size=128).describe()
    # The wording may change; the numbers a person acts on may not.
    for part in ("micro batch 32", "4 accumulation steps", "global batch 128"):
        assert part in text
    assert "rank" not in text
    assert "+" not in text  # no remainder to mention


def test_describe_single_step_is_singular() -> None:
    text = recommend(max_micro_batch_size=64, probes=[], global_batch_size=64).describe()
    assert "1 accumulation step" in text
    assert "steps" not in text


def test_describe_names_ranks_and_the_uneven_split() -> None:
    plan = recommend(
        max_micro_batch_size=31, probes=[], global_batch_size=400, mesh=MeshShape(4), policy="max"
    )
    # Sizes that differ: the runs and what they hold, never 31 × 4 × 4 (496).
    assert plan.describe() == "3×31 + 7 = 100 samples a step × 4 ranks = global batch 400"


def test_quickstart_balanced_default_gives_four_micro_batches_of_64() -> None:
    """M* = 65 and B = 256: max runs 3×65 + 61, balanced the same 4 steps of 64."""
    probes = [probe(1, speed=10.0), probe(65, speed=90.0, peak=6500), probe(66, fits=False)]
    plan = recommend(max_micro_batch_size=65, probes=probes, global_batch_size=256)
    assert plan.policy == DEFAULT_POLICY == "balanced"
    assert (plan.micro_batch_size, plan.grad_accum, plan.flat_split()) == (64, 4, [64] * 4)
    assert "micro batch 64 × 4 accumulation steps = global batch 256" in plan.describe()
    # 64 was never probed: the numbers are those of 65, a measured upper bound on the peak.
    assert (plan.expected_peak_bytes, plan.expected_samples_per_second) == (6500, 90.0)
    assert plan.measured_samples_per_second == {1: 10.0, 65: 90.0}
    maximal = recommend(max_micro_batch_size=65, probes=probes, global_batch_size=256, policy="max")
    assert maximal.flat_split() == [65, 65, 65, 61]


def test_balanced_split_of_an_awkward_batch() -> None:
    # The dashboard's case: 256 with M* = 31 is 8×31 + 8 under max, 9 steps of 28 or 29 here.
    plan = recommend(max_micro_batch_size=31, probes=[], global_batch_size=256)
    assert plan.flat_split() == [29] * 4 + [28] * 5
    assert "4×29 + 5×28" in plan.describe()
    assert plan.micro_batch_size == 29
    assert recommend(
        max_micro_batch_size=31, probes=[], global_batch_size=256, policy="max"
    ).flat_split() == [31] * 8 + [8]


@pytest.mark.parametrize(
    ("policy", "probes", "global_batch", "words"),
    [
        ("balanced", [], 256, ["fewest micro batches", "M* = 31", "29, not of 31"]),
        ("balanced", [], 248, ["8 equal micro batches of 31"]),
        ("max", [], 256, ["largest", "M* = 31", "remainder 8"]),
        ("even", [], 256, ["16 micro batches of 16", "the fewest equal micro batches"]),
        ("even", [], 62, ["2 micro batches of 31", "largest divisor of 62 up to 31"]),
        ("throughput", [probe(8, speed=50.0), probe(31, speed=40.0)], 256, ["8 ran fastest"]),
        ("throughput", [], 256, ["no throughput was measured"]),
        ("max", [], 20, ["whole batch of 20 fits in one micro batch"]),
    ],
)
def test_every_policy_says_why_in_one_line(
    policy: str, probes: list[ProbeResult], global_batch: int, words: list[str]
) -> None:
    plan = recommend(
        max_micro_batch_size=31, probes=probes, global_batch_size=global_batch, policy=policy
    )
    assert plan.reason.startswith(f"{policy}: ")
    assert "\n" not in plan.reason
    for word in words:
        assert word in plan.reason, (word, plan.reason)


@pytest.mark.parametrize(
    ("split", "text"),
    [
        ([12, 12, 12, 4], "3×12 + 4"),
        ([5], "5"),
        ([7, 3], "7 + 3"),
        ([4, 4], "2×4"),
        ([29, 29, 28, 28, 28], "2×29 + 3×28"),
    ],
)
def test_format_split(split: list[int], text: str) -> None:
    assert format_split(split) == text
    assert format_runs(runs_of(split)) == text


def test_the_split_is_runs_whose_size_does_not_grow_with_the_batch() -> None:
    """At M* = 1 and the largest global batch the service takes, a flat split listed
    1,048,576 micro batches (about 2 MiB of JSON); the runs are one pair."""
    plan = recommend(max_micro_batch_size=1, probes=[], global_batch_size=2**20)
    assert plan.split == [Run(size=1, times=2**20)]
    assert plan.grad_accum == 2**20
    document = plan.model_dump_json()
    assert len(document) < 1024, len(document)
    assert '"split":[[1,1048576]]' in document
    assert len(plan.flat_split()) == 2**20  # the training loop's view, in process only
    awkward = recommend(max_micro_batch_size=31, probes=[], global_batch_size=256)
    assert awkward.split == [Run(29, 4), Run(28, 5)]
    assert '"split":[[29,4],[28,5]]' in awkward.model_dump_json()
    assert Recommendation.model_validate_json(awkward.model_dump_json()) == awkward


def test_a_flat_split_is_read_as_runs_and_runs_must_add_up() -> None:
    plan = recommend(max_micro_batch_size=31, probes=[], global_batch_size=256)
    flat = {**plan.model_dump(), "split": plan.flat_split()}
    assert Recommendation.model_validate(flat) == plan  # an answer kept by earlier versions
    for wrong in ([[29, 4], [28, 4]], [[29, 9]], [[29, 4], [28, 5], [0, 3]], [[-1, 9]], []):
        with pytest.raises(ValidationError, match="split"):
            Recommendation.model_validate({**plan.model_dump(), "split": wrong})


@given(
    per_rank=st.integers(min_value=1, max_value=5000),
    world=st.integers(min_value=1, max_value=64),
    m_star=st.integers(min_value=1, max_value=6000),
)
def test_split_property_sums_to_per_rank_batch_and_respects_m_star(
    per_rank: int, world: int, m_star: int
) -> None:
    plan = recommend(
        max_micro_batch_size=m_star,
        probes=[],
        global_batch_size=per_rank * world,
        mesh=MeshShape(world),
        policy="max",
    )
    split = plan.flat_split()
    assert sum(split) == per_rank
    assert all(1 <= size <= m_star for size in split)
    # Only the last micro batch may be smaller than the others.
    assert all(size == split[0] for size in split[:-1])
    assert split[-1] <= split[0]
    assert plan.grad_accum == len(split)
    assert plan.micro_batch_size == split[0] == min(m_star, per_rank)
    # The fewest steps possible with micro batches of at most M*.
    assert plan.grad_accum == -(-per_rank // m_star)


@given(
    per_rank=st.integers(min_value=1, max_value=5000),
    world=st.integers(min_value=1, max_value=16),
    m_star=st.integers(min_value=1, max_value=6000),
)
def test_balanced_property_fewest_micro_batches_within_one_of_each_other(
    per_rank: int, world: int, m_star: int
) -> None:
    plan = recommend(
        max_micro_batch_size=m_star,
        probes=[],
        global_batch_size=per_rank * world,
        mesh=MeshShape(world),
    )
    split = plan.flat_split()
    fewest = -(-per_rank // m_star)  # k = ⌈b / M*⌉
    assert sum(split) == per_rank
    assert len(split) == plan.grad_accum == fewest
    assert max(split) - min(split) <= 1
    assert all(1 <= size <= m_star for size in split)
    assert split == sorted(split, reverse=True)  # the larger ones first
    assert plan.micro_batch_size == max(split) == -(-per_rank // fewest)
    assert split == balanced_split(per_rank, m_star)


@given(
    policy=st.sampled_from(POLICIES),
    per_rank=st.integers(min_value=1, max_value=600),
    m_star=st.integers(min_value=1, max_value=700),
    speeds=st.dictionaries(
        st.integers(min_value=1, max_value=700),
        st.floats(min_value=0.1, max_value=1e5, allow_nan=False),
        max_size=6,
    ),
)
def test_every_policy_property_sums_to_the_batch_and_fits(
    policy: str, per_rank: int, m_star: int, speeds: dict[int, float]
) -> None:
    probes = [probe(size, speed=speed, fits=size <= m_star) for size, speed in speeds.items()]
    plan = recommend(
        max_micro_batch_size=m_star, probes=probes, global_batch_size=per_rank, policy=policy
    )
    assert sum(plan.flat_split()) == per_rank
    assert all(1 <= size <= min(m_star, per_rank) for size in plan.flat_split())
    assert plan.grad_accum == len(plan.flat_split())
    assert plan.micro_batch_size == max(plan.flat_split())
    assert len(set(plan.flat_split())) <= 2  # at most two sizes in any policy's split
    assert len(plan.split) <= 2  # so at most two runs, whatever the batch
    assert plan.split == runs_of(plan.flat_split())
    assert plan.reason.startswith(f"{policy}: ")
    if policy in ("balanced", "max"):
        assert plan.grad_accum == -(-per_rank // m_star)
