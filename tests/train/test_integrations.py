"""Recommendations applied to the Hugging Face Trainer and Lightning, when installed."""

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
    samples_per_second,
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


def test_uneven_recommendations_become_equal_and_keep_the_global_batch() -> None:
    recommendation = _recommendation(found=31, batch=400, world=4, policy="max")
    assert recommendation.split == [(31, 3), (7, 1)]
    micro, steps = equal_settings(recommendation)
    assert (micro, steps) == (25, 4)
    assert micro * steps * 4 == 400
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


def test_lightning_trainer_takes_the_accumulation_steps() -> None:
    lightning = pytest.importorskip("lightning")
    settings = lightning_arguments(_recommendation(found=12, batch=64), world_size=1)
    trainer = lightning.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accumulate_grad_batches=settings["accumulate_grad_batches"],
    )
    assert trainer.accumulate_grad_batches == 8
    assert settings["batch_size"] == 8


def test_lightning_and_hugging_face_refuse_a_plan_for_another_world_size() -> None:
    two_ranks = _recommendation(found=12, batch=48, world=2)
    with pytest.raises(BadInputError, match=r"for 2 ranks .* on 1: ask again with world_size=1"):
        lightning_arguments(two_ranks, world_size=1)
    with pytest.raises(BadInputError, match="world_size=1"):
        huggingface_arguments(two_ranks, world_size=1)
    assert lightning_arguments(two_ranks, world_size=2)["accumulate_grad_batches"] == 2


@pytest.mark.parametrize(
    ("policy", "speeds", "expected"),
    [
        # Split already equal: every policy keeps it as it is.
        ("balanced", {}, (25, 4)),
        ("even", {25: 100.0, 31: 101.0}, (25, 4)),
        # max: 3×31 + 7 becomes the largest divisor of 100 that fits.
        ("max", {}, (25, 4)),
        # throughput chose 8 (the fastest probe): equal sizes by the same measure, 20 × 5 is
        # faster than 25 × 4 here.
        ("throughput", {8: 900.0, 20: 1000.0, 25: 400.0, 31: 500.0}, (20, 5)),
    ],
)
def test_equal_settings_follow_the_recommendations_policy(
    policy: str, speeds: dict[int, float], expected: tuple[int, int]
) -> None:
    recommendation = _recommendation(found=31, batch=100, policy=policy, speeds=speeds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EqualMicroBatchWarning)
        assert equal_settings(recommendation) == expected


def test_equal_micro_batches_that_cost_throughput_warn_with_the_nearest_good_batches() -> None:
    # 37 is prime: equal micro batches are 37 of 1 where balanced runs 4 of 9 or 10.
    recommendation = _recommendation(found=10, batch=37, speeds=SPEEDS)
    assert recommendation.split == [(10, 1), (9, 3)]
    with pytest.warns(EqualMicroBatchWarning) as caught:
        assert lightning_arguments(recommendation, world_size=1) == {
            "batch_size": 1,
            "accumulate_grad_batches": 37,
        }
    message = str(caught[0].message)
    assert "37 micro batches of 1" in message
    # 36 = 4 × 9 and 40 = 4 × 10 run equal micro batches at the balanced speed.
    assert "global batch 36 or 40 would not" in message
    assert "slower than 10 + 3×9" in message


def test_the_nearest_good_batches_on_a_mesh_count_data_parallel_groups() -> None:
    # 4 ranks as 2 × 2: B = 26 is 13 per data-parallel group; 12 and 14 per group run
    # equal micro batches at the balanced speed, so the global batches are 24 and 28.
    recommendation = _recommendation(found=10, batch=26, world=4, tp=2, speeds=SPEEDS)
    assert recommendation.per_rank_batch_size == 13
    with pytest.warns(EqualMicroBatchWarning) as caught:
        lightning_arguments(recommendation, world_size=4)
    assert "global batch 24 or 28 would not" in str(caught[0].message)


def test_equal_micro_batches_at_full_speed_do_not_warn() -> None:
    recommendation = _recommendation(found=10, batch=40, world=2, speeds=SPEEDS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert huggingface_arguments(recommendation, world_size=2) == {
            "per_device_train_batch_size": 10,
            "gradient_accumulation_steps": 2,
        }


def test_speed_of_a_split_reads_unprobed_sizes_off_the_measured_line() -> None:
    # t(m) = 10 ms + 1 ms·m through the two measured sizes: 5 samples take 15 ms.
    assert samples_per_second([(5, 1)], SPEEDS) == pytest.approx(5 / 0.015)
    assert samples_per_second([(10, 1), (1, 1)], SPEEDS) == pytest.approx(11 / 0.031)
    assert samples_per_second([(10, 3)], SPEEDS) == samples_per_second([(10, 1)], SPEEDS)
    assert samples_per_second([(20, 1)], SPEEDS) == pytest.approx(20 / 0.030)  # beyond: extended
    assert samples_per_second([(4, 1)], {2: 100.0}) == pytest.approx(100.0)  # one point: same
