"""Recommendations applied to the Hugging Face Trainer and Lightning: the answer's own
equal split (``recommendation.equal``), never one the integration decides, and its
warning when that split is much slower."""

from __future__ import annotations

import warnings

import pytest

from tuner.core.errors import BadInputError, NothingFitsError
from tuner.core.plan import largest_equal_micro_batch, recommend
from tuner.core.results import ProbeResult
from tuner.core.shape import MeshShape
from tuner.train.integrations import (
    EqualMicroBatchWarning,
    apply_to_training_arguments,
    equal_settings,
    huggingface_arguments,
    lightning_arguments,
)


def _recommendation(
    found: int,
    batch: int,
    world: int = 1,
    policy: str = "balanced",
    speeds: dict[int, float] | None = None,
    tp: int = 1,
):
    probes = [
        ProbeResult(micro_batch_size=size, fits=True, samples_per_second=speed)
        for size, speed in (speeds or {}).items()
    ]
    return recommend(
        max_micro_batch_size=found,
        probes=probes,
        global_batch_size=batch,
        mesh=MeshShape(world, tp),
        policy=policy,
    )


# Time of one micro batch ≈ 10 ms + 1 ms a sample: small micro batches are slow.
SPEEDS = {1: 1 / 0.011, 10: 10 / 0.020}


@pytest.mark.parametrize(
    ("per_rank", "found", "micro"), [(100, 31, 25), (96, 32, 32), (97, 31, 1), (8, 64, 8)]
)
def test_largest_equal_micro_batch_divides_the_batch(per_rank, found, micro) -> None:
    assert largest_equal_micro_batch(per_rank, found) == micro
    with pytest.raises(NothingFitsError):
        largest_equal_micro_batch(per_rank, 0)


def test_uneven_recommendations_run_the_answers_equal_split() -> None:
    recommendation = _recommendation(found=31, batch=400, world=4, policy="max")
    assert recommendation.split == [(31, 3), (7, 1)]
    assert equal_settings(recommendation) == (25, 4)
    assert (recommendation.equal.micro_batch_size, recommendation.equal.grad_accum) == (25, 4)
    assert lightning_arguments(recommendation, world_size=4) == {
        "batch_size": 25,
        "accumulate_grad_batches": 4,
    }
    assert huggingface_arguments(recommendation, world_size=4) == {
        "per_device_train_batch_size": 25,
        "gradient_accumulation_steps": 4,
    }


def test_hugging_face_training_arguments(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    arguments = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    updated = apply_to_training_arguments(arguments, _recommendation(found=12, batch=48))
    assert (updated.per_device_train_batch_size, updated.gradient_accumulation_steps) == (12, 4)
    assert arguments.per_device_train_batch_size == 8  # the caller's object is left alone
    with pytest.raises(BadInputError, match="world_size=1"):
        apply_to_training_arguments(arguments, _recommendation(found=12, batch=48, world=2))


def test_lightning_and_hugging_face_refuse_a_plan_for_another_world_size() -> None:
    two_ranks = _recommendation(found=12, batch=48, world=2)
    with pytest.raises(BadInputError, match=r"for 2 ranks .* on 1: ask again with world_size=1"):
        lightning_arguments(two_ranks, world_size=1)
    with pytest.raises(BadInputError, match="world_size=1"):
        huggingface_arguments(two_ranks, world_size=1)
    assert lightning_arguments(two_ranks, world_size=2)["accumulate_grad_batches"] == 2


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("balanced", (25, 4)),
        ("even", (25, 4)),
        ("max", (25, 4)),  # 3×31 + 7: the fewest equal micro batches instead
        ("throughput", (20, 5)),  # the fastest probe, 20, divides 100: equal already
    ],
)
def test_the_equal_split_is_the_answers_own(policy: str, expected: tuple[int, int]) -> None:
    speeds = {8: 900.0, 20: 1000.0, 25: 400.0, 31: 500.0}
    recommendation = _recommendation(found=31, batch=100, policy=policy, speeds=speeds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EqualMicroBatchWarning)
        assert equal_settings(recommendation) == expected


def test_a_much_slower_equal_split_warns_once_with_the_nearest_good_batches() -> None:
    # 37 is prime: equal micro batches are 37 of 1 where balanced runs 4 of 9 or 10.
    recommendation = _recommendation(found=10, batch=37, speeds=SPEEDS)
    assert recommendation.split == [(10, 1), (9, 3)]
    with pytest.warns(EqualMicroBatchWarning) as caught:
        assert lightning_arguments(recommendation, world_size=1) == {
            "batch_size": 1,
            "accumulate_grad_batches": 37,
        }
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "micro batch 1 × 37 accumulation steps" in message
    assert "slower than 10 + 3×9" in message
    # 36 = 4 × 9 and 40 = 4 × 10 run equal micro batches at the balanced speed.
    assert "global batch 36 splits well: micro batch 9 × 4" in message
    assert "global batch 40 splits well: micro batch 10 × 4" in message
    assert [n.global_batch_size for n in recommendation.equal.nearby] == [36, 40]


def test_the_nearest_good_batches_on_a_mesh_count_data_parallel_groups() -> None:
    # 4 ranks as 2 × 2: B = 26 is 13 per data-parallel group; 12 and 14 per group run
    # equal micro batches at the balanced speed, so the global batches are 24 and 28.
    recommendation = _recommendation(found=10, batch=26, world=4, tp=2, speeds=SPEEDS)
    assert recommendation.per_rank_batch_size == 13
    with pytest.warns(EqualMicroBatchWarning) as caught:
        lightning_arguments(recommendation, world_size=4)
    message = str(caught[0].message)
    assert "global batch 24 splits well" in message
    assert "global batch 28 splits well" in message


def test_equal_micro_batches_at_full_speed_do_not_warn() -> None:
    recommendation = _recommendation(found=10, batch=40, world=2, speeds=SPEEDS)
    assert recommendation.equal.warning is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert huggingface_arguments(recommendation, world_size=2) == {
            "per_device_train_batch_size": 10,
            "gradient_accumulation_steps": 2,
        }


def test_without_speeds_micro_batch_one_is_never_taken_in_silence() -> None:
    recommendation = _recommendation(found=76, batch=251)
    assert recommendation.equal.slower_by is None
    with pytest.warns(EqualMicroBatchWarning, match="251 micro batches where 3×63 \\+ 62 runs 4"):
        assert lightning_arguments(recommendation, world_size=1)["batch_size"] == 1
