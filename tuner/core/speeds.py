"""How fast a step trains at each micro batch size: the speed curve a profile keeps.

Bigger micro batches are not always faster. On the CPU a small one stays in cache; on a
GPU the speed curve flattens early for a small model or a long sequence. After ``M*`` is
found the engine times micro batches of a few sizes (``M*`` or the fewest-steps size for
the batch asked, then about halves of it) as training runs them, in interleaved rounds,
and keeps, for each size ``m``, the seconds per sample of its micro batches (forward and
backward, accumulating gradients) in every round, and the seconds of one optimizer step.

A plan's step on one rank runs micro batches ``m_1 … m_k`` and then the optimizer:

    T(plan)  = Σ_i m_i · s(m_i) + t_opt
    speed    = b / T(plan)                    (samples per second on one rank, b = Σ m_i)

``s(m)`` is the fastest round at a measured size and is interpolated linearly between
measured sizes; a plan with a micro batch outside the measured sizes has no estimate (the
curve never extrapolates). How far apart a size's rounds lie is its spread,

    spread(m) = 1 − fastest round / slowest round      (a fraction of the fastest speed)

and a plan's spread is the largest of the sizes it leans on. The rounds are interleaved
(round ``r`` of every size ran one after another), so one plan is called faster than
another only by the paired rounds: the gain ``T_r(one) / T_r(other) − 1`` of each round
``r``, above zero with 95% confidence (:func:`tuner.core.plan.fastest_split`).

Torch-free: the service answers other batch sizes from a stored curve.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Sizes a curve keeps and rounds a size keeps: bounded, so that a stored profile is too.
MAX_TIMED_SIZES = 16
MAX_ROUNDS = 16


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TimedSize(_Frozen):
    """Micro batches of ``micro_batch_size``: the seconds per sample of each timed round."""

    micro_batch_size: int = Field(ge=1)
    seconds_per_sample: list[float] = Field(min_length=1, max_length=MAX_ROUNDS)

    @model_validator(mode="after")
    def _positive(self) -> TimedSize:
        if any(not 0 < s < float("inf") for s in self.seconds_per_sample):
            raise ValueError("seconds_per_sample must be positive finite numbers, one a round")
        return self

    @property
    def best(self) -> float:
        """The fastest round's seconds per sample: a busy spell only ever slows a round."""
        return min(self.seconds_per_sample)

    @property
    def samples_per_second(self) -> float:
        return 1.0 / self.best

    @property
    def spread(self) -> float:
        """``1 − fastest / slowest`` (0 with one round: no spread seen)."""
        return 1.0 - self.best / max(self.seconds_per_sample)


class SpeedCurve(_Frozen):
    """The timed sizes, smallest first, and one optimizer step's seconds."""

    sizes: list[TimedSize] = Field(min_length=1, max_length=MAX_TIMED_SIZES)
    optimizer_seconds: float = Field(ge=0, allow_inf_nan=False)
    per_rank_batch_size: int | None = Field(
        default=None,
        ge=1,
        description="the per-rank batch whose splits the sizes were chosen for (the global "
        "batch the profile was asked for, over its data-parallel ranks); None without one",
    )

    @model_validator(mode="after")
    def _ascending(self) -> SpeedCurve:
        order = [t.micro_batch_size for t in self.sizes]
        if order != sorted(set(order)):
            raise ValueError("sizes must be distinct micro batch sizes, smallest first")
        return self

    @property
    def smallest(self) -> int:
        return self.sizes[0].micro_batch_size

    @property
    def largest(self) -> int:
        return self.sizes[-1].micro_batch_size

    def covers(self, micro_batch_size: int) -> bool:
        return self.smallest <= micro_batch_size <= self.largest

    def seconds_per_sample(self, micro_batch_size: int) -> float | None:
        """``s(m)``: the fastest round at a measured size, linear between two; ``None``
        outside the measured sizes."""
        if not self.covers(micro_batch_size):
            return None
        for low, high in zip(self.sizes, self.sizes[1:], strict=False):
            if low.micro_batch_size <= micro_batch_size <= high.micro_batch_size:
                share = (micro_batch_size - low.micro_batch_size) / (
                    high.micro_batch_size - low.micro_batch_size
                )
                return low.best + share * (high.best - low.best)
        return self.sizes[0].best  # one size measured, and it is this one

    def step_seconds(self, runs: Iterable[tuple[int, int]]) -> float | None:
        """``T(plan)`` for runs ``[(size, count), ...]``; ``None`` when a size is not covered."""
        total = self.optimizer_seconds
        for size, count in runs:
            per_sample = self.seconds_per_sample(size)
            if per_sample is None:
                return None
            total += count * size * per_sample
        return total

    def samples_per_second(self, runs: Sequence[tuple[int, int]]) -> float | None:
        """``b / T(plan)`` on one rank; ``None`` when a size is not covered."""
        seconds = self.step_seconds(runs)
        if seconds is None or seconds <= 0:
            return None
        return sum(size * count for size, count in runs) / seconds

    def spread(self, runs: Iterable[tuple[int, int]]) -> float:
        """The largest spread of the measured sizes the plan's sizes lie at or between."""
        spreads = [0.0]
        for size, _ in runs:
            below = [t for t in self.sizes if t.micro_batch_size <= size]
            above = [t for t in self.sizes if t.micro_batch_size >= size]
            spreads += [t.spread for t in (below[-1:] + above[:1])]
        return max(spreads)
