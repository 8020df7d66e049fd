"""Recommendations applied to the Hugging Face Trainer and Lightning, when installed."""

from __future__ import annotations

import pytest

from tuner.core.errors import BadInputError, NothingFitsError
from tuner.core.plan import largest_equal_micro_batch, recommend
from tuner.train.integrations import (
    apply_to_training_arguments,
    equal_settings,
    huggingface_arguments,
    lightning_arguments,
)


def _recommendation(found: int, batch: int, world: int = 1):
    return recommend(
        max_micro_batch_size=found, probes=[], global_batch_size=batch, world_size=world
    )


@pytest.mark.parametrize(
    ("per_rank", "found", "micro"), [(100, 31, 25), (96, 32, 32), (97, 31, 1), (8, 64, 8)]
)
def test_largest_equal_micro_batch_divides_the_batch(per_rank, found, micro) -> None:
    assert largest_equal_micro_batch(per_rank, found) == micro
    with pytest.raises(NothingFitsError):
        largest_equal_micro_batch(per_rank, 0)


def test_uneven_recommendations_become_equal_and_keep_the_global_batch() -> None:
    recommendation = _recommendation(found=31, batch=400, world=4)
    assert recommendation.split == [31, 31, 31, 7]
    micro, steps = equal_settings(recommendation)
    assert (micro, steps) == (25, 4)
    assert micro * steps * 4 == 400
    assert lightning_arguments(recommendation) == {"batch_size": 25, "accumulate_grad_batches": 4}
    assert huggingface_arguments(recommendation) == {
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
    settings = lightning_arguments(_recommendation(found=12, batch=64))
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
