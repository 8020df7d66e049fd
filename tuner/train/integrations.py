"""A recommendation applied to training frameworks that accumulate on their own.

The Hugging Face Trainer and Lightning run equal micro batches only, so a split whose
sizes differ (``2×29 + 7×28``) becomes equal micro batches that divide ``b = B / dp`` (the
data-parallel groups of the recommendation's mesh): the global batch stays exactly what was
asked. Which divisor honours the recommendation's
policy: ``throughput`` takes the fastest by the measured speeds, every other policy the
largest divisor that fits, which is also the fewest micro batches.

Equal micro batches can cost speed: ``B = 37`` on one rank has no divisor but 1 and 37, so
with ``M* = 10`` it runs 37 micro batches of 1. When the measured throughput says equal
micro batches run more than 5% slower than the recommendation, a warning names the nearest
global batch sizes that would not. Speeds at sizes never probed are read off the measured
ones: the time of one micro batch is taken as linear in its size between (and beyond) the
probed sizes, ``t(m) = m / samples_per_second(m)``.

Both libraries are optional; nothing here imports them until asked to.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from tuner.core.errors import BadInputError
from tuner.core.plan import (
    EVEN_THROUGHPUT_TOLERANCE,
    Recommendation,
    balanced_runs,
    format_runs,
    largest_equal_micro_batch,
)

if TYPE_CHECKING:
    from transformers import TrainingArguments

# How far from the asked global batch the warning looks for one that runs equal micro
# batches at full speed, as a fraction of the batch.
NEAREST_SEARCH_FRACTION = 0.5


class EqualMicroBatchWarning(UserWarning):
    """Equal micro batches for this batch run measurably slower than the recommendation."""


def equal_settings(recommendation: Recommendation) -> tuple[int, int]:
    """``(micro batch, accumulation steps)`` with equal micro batches and the exact batch,
    chosen by the recommendation's policy; warns (``EqualMicroBatchWarning``) when they cost
    more than 5% of the measured throughput."""
    per_rank = recommendation.per_rank_batch_size
    speeds = recommendation.measured_samples_per_second
    if len(recommendation.split) == 1:
        micro = recommendation.split[0].size
    elif recommendation.policy == "throughput" and speeds:
        micro = _fastest_divisor(per_rank, recommendation.max_micro_batch_size, speeds)
    else:
        micro = largest_equal_micro_batch(per_rank, recommendation.max_micro_batch_size)
    if speeds:
        _warn_if_slower(recommendation, micro, speeds)
    return micro, per_rank // micro


def huggingface_arguments(recommendation: Recommendation, *, world_size: int) -> dict[str, int]:
    """Keyword arguments for ``transformers.TrainingArguments`` that will train on
    ``world_size`` ranks (refused when the recommendation is for another number)."""
    _check_world_size(recommendation, world_size, "these TrainingArguments train")
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
    micro, steps = equal_settings(recommendation)
    return dataclasses.replace(
        arguments, per_device_train_batch_size=micro, gradient_accumulation_steps=steps
    )


def lightning_arguments(recommendation: Recommendation, *, world_size: int) -> dict[str, Any]:
    """``batch_size`` for the DataLoader and ``accumulate_grad_batches`` for a Trainer that
    trains on ``world_size`` ranks (``devices × num_nodes``); refused when the
    recommendation is for another number."""
    _check_world_size(recommendation, world_size, "the Lightning Trainer trains")
    micro, steps = equal_settings(recommendation)
    return {"batch_size": micro, "accumulate_grad_batches": steps}


def _check_world_size(recommendation: Recommendation, world_size: int, where: str) -> None:
    if world_size != recommendation.world_size:
        raise BadInputError(
            f"the recommendation is for {recommendation.world_size} ranks but {where} on "
            f"{world_size}: ask again with world_size={world_size}"
        )


def seconds_per_micro_batch(size: int, speeds: Mapping[int, float]) -> float:
    """Time of one micro batch of ``size``: measured, else linear in the size through the
    two nearest measured sizes (one measured size: the same samples per second)."""
    if size in speeds:
        return size / speeds[size]
    times = sorted((m, m / rate) for m, rate in speeds.items())
    below = [point for point in times if point[0] < size]
    above = [point for point in times if point[0] > size]
    if below and above:
        pair = [below[-1], above[0]]
    else:
        pair = (below[-2:] if below else above[:2]) if len(times) >= 2 else times * 2
    (m0, t0), (m1, t1) = pair
    if m0 == m1:
        return t0 * size / m0
    estimate = t0 + (t1 - t0) * (size - m0) / (m1 - m0)
    # An extrapolation below zero means no time per sample is known: keep the nearest speed.
    return estimate if estimate > 0 else size * min(t0 / m0, t1 / m1)


def samples_per_second(runs: Iterable[tuple[int, int]], speeds: Mapping[int, float]) -> float:
    """Speed of one step of micro batches in ``runs`` of ``(size, count)``:
    ``Σ size·count / Σ count·t(size)``."""
    runs = list(runs)
    samples = sum(size * count for size, count in runs)
    return samples / sum(count * seconds_per_micro_batch(size, speeds) for size, count in runs)


def _fastest_divisor(per_rank: int, m_star: int, speeds: Mapping[int, float]) -> int:
    divisors = [d for d in range(1, min(m_star, per_rank) + 1) if per_rank % d == 0]
    return max(divisors, key=lambda d: (samples_per_second([(d, 1)], speeds), d))


def _equal_keeps_up(per_rank: int, m_star: int, speeds: Mapping[int, float]) -> bool:
    """Whether equal micro batches for ``per_rank`` stay within 5% of the balanced split."""
    micro = largest_equal_micro_batch(per_rank, m_star)
    reference = samples_per_second(balanced_runs(per_rank, min(m_star, per_rank)), speeds)
    return samples_per_second([(micro, 1)], speeds) >= (1 - EVEN_THROUGHPUT_TOLERANCE) * reference


def _warn_if_slower(
    recommendation: Recommendation, micro: int, speeds: Mapping[int, float]
) -> None:
    reference = samples_per_second(recommendation.split, speeds)
    equal = samples_per_second([(micro, 1)], speeds)
    if equal >= (1 - EVEN_THROUGHPUT_TOLERANCE) * reference:
        return
    # A global batch is split over the data-parallel groups, not over every rank.
    groups, per_rank = recommendation.mesh.dp, recommendation.per_rank_batch_size
    m_star = recommendation.max_micro_batch_size
    reach = max(1, int(per_rank * NEAREST_SEARCH_FRACTION))
    lower = next(
        (
            b
            for b in range(per_rank - 1, max(0, per_rank - reach) - 1, -1)
            if b >= 1 and _equal_keeps_up(b, m_star, speeds)
        ),
        None,
    )
    higher = next(
        (
            b
            for b in range(per_rank + 1, per_rank + reach + 1)
            if _equal_keeps_up(b, m_star, speeds)
        ),
        None,
    )
    nearest = [str(b * groups) for b in (lower, higher) if b is not None]
    hint = (
        f"global batch {' or '.join(nearest)} would not"
        if nearest
        else "no global batch within 50% of it would do better"
    )
    warnings.warn(
        f"equal micro batches for global batch {recommendation.global_batch_size} run "
        f"{per_rank // micro} micro batches of {micro} at about {equal:.1f} samples/s, "
        f"{1 - equal / reference:.0%} slower than {format_runs(recommendation.split)} "
        f"({reference:.1f} samples/s, measured); {hint}",
        EqualMicroBatchWarning,
        stacklevel=3,
    )
