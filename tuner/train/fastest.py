"""Equal micro batches timed side by side: the fewest that fit against splits into more,
smaller ones, for the framework integrations (``time_splits=True``).

Bigger micro batches are not always faster: on a GPU the speed curve flattens early for a
small model or a long sequence, and a smaller micro batch can train faster for the same
global batch. Each candidate divides the per-rank batch (the frameworks run equal micro
batches only) and is at most ``M*``; each is run as training runs it, one optimizer step
accumulating over the whole per-rank batch, in interleaved rounds (a busy spell slows
whichever runs in it; the rounds show how much). A candidate replaces the fewest-steps
plan only when it is faster by more than the spread of the two's rounds:

    samples/s = per-rank batch / seconds per optimizer step      (its fastest round)
    spread    = (fastest − slowest round) / fastest
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.engine.backends import Backend
from tuner.engine.explore import spread_of
from tuner.engine.probe import Prober
from tuner.engine.workload import Workload

# Rounds of timed steps per candidate: three, so that a spread is seen at all.
ROUNDS = 3
# The fewest-steps micro batch and up to three smaller ones, each about half the last.
CANDIDATES = 4


@dataclass(frozen=True)
class TimedSplit:
    """One candidate: equal micro batches of ``micro_batch_size``, the samples per second
    of each round."""

    micro_batch_size: int
    speeds: tuple[float, ...]

    @property
    def samples_per_second(self) -> float:
        return max(self.speeds)

    @property
    def spread(self) -> float:
        return spread_of(list(self.speeds)) or 0.0


def candidate_micro_batches(per_rank: int, largest: int, count: int = CANDIDATES) -> list[int]:
    """The largest divisor of ``per_rank`` that fits (``≤ largest``, the fewest steps),
    then divisors of about half the one before: more, smaller micro batches."""
    divisors = [d for d in range(1, min(largest, per_rank) + 1) if per_rank % d == 0]
    chosen = [divisors[-1]]
    for divisor in reversed(divisors):
        if len(chosen) == count:
            break
        if divisor <= chosen[-1] // 2:
            chosen.append(divisor)
    return chosen


def time_micro_batches(
    workload: Workload,
    backend: Backend,
    *,
    per_rank: int,
    sizes: list[int],
    headroom: float,
    rounds: int = ROUNDS,
) -> list[TimedSplit]:
    """Each size in ``sizes`` timed as one optimizer step over ``per_rank`` samples in equal
    micro batches, ``rounds`` interleaved rounds; the model, optimizer and RNG are put back
    after every step (:meth:`Prober.time_split`)."""
    speeds: dict[int, list[float]] = {size: [] for size in sizes}
    with backend.session(), Prober(workload, backend, headroom=headroom) as prober:
        for _ in range(rounds):
            for size in sizes:
                seconds = prober.time_split([size] * (per_rank // size), steps=1)
                speeds[size].append(per_rank / seconds)
    return [TimedSplit(size, tuple(speeds[size])) for size in sizes]


def fastest(timed: list[TimedSplit]) -> tuple[TimedSplit, str]:
    """The candidate to train with, and why: the first (the fewest steps) unless another is
    faster by more than the spread of the two."""
    fewest = timed[0]
    best = max(timed, key=lambda t: t.samples_per_second)
    if best is fewest:
        return fewest, "the fewest micro batches were also the fastest timed"
    gain = best.samples_per_second / fewest.samples_per_second - 1
    noise = max(best.spread, fewest.spread)
    if gain > noise:
        return best, (
            f"micro batches of {best.micro_batch_size} timed {gain:.0%} faster than of "
            f"{fewest.micro_batch_size}, more than the spread of the rounds ({noise:.0%})"
        )
    return fewest, (
        f"micro batches of {best.micro_batch_size} timed {gain:.0%} faster than of "
        f"{fewest.micro_batch_size}, within the spread of the rounds ({noise:.0%}): kept "
        "the fewest"
    )
