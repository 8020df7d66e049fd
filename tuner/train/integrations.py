"""A recommendation applied to training frameworks that accumulate on their own.

The Hugging Face Trainer and Lightning run equal micro batches only, so an uneven split
(``3×31 + 7``) becomes the largest equal micro batch that fits and divides ``B / W``:
the global batch stays exactly what was asked. Both libraries are optional; nothing here
imports them until asked to.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from tuner.core.errors import BadInputError
from tuner.core.plan import Recommendation, largest_equal_micro_batch

if TYPE_CHECKING:
    from transformers import TrainingArguments


def equal_settings(recommendation: Recommendation) -> tuple[int, int]:
    """``(micro batch, accumulation steps)`` with equal micro batches and the exact batch."""
    per_rank = recommendation.per_rank_batch_size
    micro = largest_equal_micro_batch(per_rank, recommendation.max_micro_batch_size)
    return micro, per_rank // micro


def huggingface_arguments(recommendation: Recommendation) -> dict[str, int]:
    """Keyword arguments for ``transformers.TrainingArguments``."""
    micro, steps = equal_settings(recommendation)
    return {"per_device_train_batch_size": micro, "gradient_accumulation_steps": steps}


def apply_to_training_arguments(
    arguments: TrainingArguments, recommendation: Recommendation
) -> TrainingArguments:
    """A copy of ``arguments`` with the micro batch and accumulation steps set.

    Refuses a recommendation made for another number of ranks than these arguments will
    train on, since the global batch would then not be the one asked for.
    """
    world_size = int(getattr(arguments, "world_size", 1) or 1)
    if world_size != recommendation.world_size:
        raise BadInputError(
            f"the recommendation is for {recommendation.world_size} ranks but these "
            f"TrainingArguments train on {world_size}: ask again with world_size={world_size}"
        )
    micro, steps = equal_settings(recommendation)
    return dataclasses.replace(
        arguments, per_device_train_batch_size=micro, gradient_accumulation_steps=steps
    )


def lightning_arguments(recommendation: Recommendation) -> dict[str, Any]:
    """``batch_size`` for the DataLoader and ``accumulate_grad_batches`` for the Trainer."""
    micro, steps = equal_settings(recommendation)
    return {"batch_size": micro, "accumulate_grad_batches": steps}
