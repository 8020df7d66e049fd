"""A recommendation applied to training frameworks that accumulate on their own.

The Hugging Face Trainer and Lightning run equal micro batches only. They do not decide
a split of their own: every answer carries the best equal split
(:class:`tuner.core.plan.EqualSplit`, decided with the recommended one by
:func:`tuner.core.plan.recommend`), micro batches of one size that divide ``b = B / dp``
(the data-parallel groups of the recommendation's mesh), so the global batch stays
exactly what was asked:

    micro batch × accumulation steps × dp = global batch

Equal micro batches can cost speed: ``B = 251`` on one rank has no divisor but 1 and 251,
so with ``M* = 76`` it runs 251 micro batches of 1. Where the answer finds the equal split
more than 10% slower than the recommended one (or, no speeds measured, twice as many micro
batches), it carries a warning naming the nearest global batches that split well and their
speed; these helpers say it as an :class:`EqualMicroBatchWarning`.

Both libraries are optional; nothing here imports them until asked to.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING, Any

from tuner.core.errors import BadInputError
from tuner.core.plan import Recommendation

if TYPE_CHECKING:
    from transformers import TrainingArguments


class EqualMicroBatchWarning(UserWarning):
    """The equal split for this batch trains much slower than the recommended split."""


def equal_settings(recommendation: Recommendation) -> tuple[int, int]:
    """``(micro batch, accumulation steps)`` of the answer's equal split
    (``recommendation.equal``): the exact global batch in micro batches of one size."""
    equal = recommendation.equal
    return equal.micro_batch_size, equal.grad_accum


def warn_if_slow(recommendation: Recommendation, *, stacklevel: int = 2) -> None:
    """Say the answer's warning about its equal split, if it has one
    (:class:`EqualMicroBatchWarning`); ``stacklevel`` counts from the caller."""
    warning = recommendation.equal.warning
    if warning is not None:
        warnings.warn(warning, EqualMicroBatchWarning, stacklevel=stacklevel + 1)


def huggingface_arguments(recommendation: Recommendation, *, world_size: int) -> dict[str, int]:
    """Keyword arguments for ``transformers.TrainingArguments`` that will train on
    ``world_size`` ranks (refused when the recommendation is for another number)."""
    _check_world_size(recommendation, world_size, "these TrainingArguments train")
    warn_if_slow(recommendation)
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
    _check_world_size(recommendation, world_size, "these TrainingArguments train")
    warn_if_slow(recommendation)
    micro, steps = equal_settings(recommendation)
    return dataclasses.replace(
        arguments, per_device_train_batch_size=micro, gradient_accumulation_steps=steps
    )


def lightning_arguments(recommendation: Recommendation, *, world_size: int) -> dict[str, Any]:
    """``batch_size`` for the DataLoader and ``accumulate_grad_batches`` for a Trainer that
    trains on ``world_size`` ranks (``devices × num_nodes``); refused when the
    recommendation is for another number."""
    _check_world_size(recommendation, world_size, "the Lightning Trainer trains")
    warn_if_slow(recommendation)
    micro, steps = equal_settings(recommendation)
    return {"batch_size": micro, "accumulate_grad_batches": steps}


def _check_world_size(recommendation: Recommendation, world_size: int, where: str) -> None:
    if world_size != recommendation.world_size:
        raise BadInputError(
            f"the recommendation is for {recommendation.world_size} ranks but {where} on "
            f"{world_size}: ask again with world_size={world_size}"
        )
