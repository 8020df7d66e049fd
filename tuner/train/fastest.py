"""Equal micro batches timed side by side: the fewest that fit against splits into more,
smaller ones, for the framework integrations (``time_splits=True``).

Bigger micro batches are not always faster: on a GPU the speed curve flattens early for a
small model or a long sequence, and a smaller micro batch can train faster for the same
global batch. Each candidate divides the per-rank batch (the frameworks run equal micro
batches only) and is at most ``M*``. Their micro batches are timed as training runs them,
in interleaved rounds (:meth:`tuner.engine.probe.Prober.time_sizes`, the speed curve of
:mod:`tuner.core.speeds`), and a candidate replaces the fewest-steps plan only when the
paired rounds have it faster with 95% confidence, by at least 2% and in every round
(:func:`tuner.core.plan.fastest_split`, which the service's answer uses too). Each round's
speed of a candidate is that of a whole step over the per-rank batch ``b``:

    samples/s = b / (b · s(m) + t_opt)      (s(m): that round's seconds per sample at m)
    spread    = 1 − fastest round / slowest round
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.core.plan import Run, fastest_split
from tuner.core.speeds import SpeedCurve
from tuner.engine.backends import Backend
from tuner.engine.probe import Prober
from tuner.engine.workload import Workload

# Rounds of timed steps per candidate: three, so that a spread is seen at all.
ROUNDS = 3
# The fewest-steps micro batch and up to three smaller ones, each about half the last.
CANDIDATES = 4


@dataclass(frozen=True)
class TimedSplit:
    """One candidate: equal micro batches of ``micro_batch_size``, the samples per second
    of a whole step in each round."""

    micro_batch_size: int
    speeds: tuple[float, ...]

    @property
    def samples_per_second(self) -> float:
        return max(self.speeds)

    @property
    def spread(self) -> float:
        return 1.0 - min(self.speeds) / max(self.speeds)


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
    sizes: list[int],
    headroom: float,
    rounds: int = ROUNDS,
) -> SpeedCurve:
    """The speed curve at ``sizes``, ``rounds`` interleaved rounds; the model, optimizer
    and RNG are put back after every step."""
    with backend.session(), Prober(workload, backend, headroom=headroom) as prober:
        return prober.time_sizes(sizes, rounds=rounds)


def timed_splits(speeds: SpeedCurve, per_rank: int) -> list[TimedSplit]:
    """Each timed size as a candidate of equal micro batches over ``per_rank`` samples,
    largest first: the speed of a whole step in each round."""
    return [
        TimedSplit(
            t.micro_batch_size,
            tuple(
                per_rank / (per_rank * s + speeds.optimizer_seconds) for s in t.seconds_per_sample
            ),
        )
        for t in reversed(speeds.sizes)
    ]


def fastest(speeds: SpeedCurve, per_rank: int, sizes: list[int]) -> tuple[int, str]:
    """The micro batch to train with (one of ``sizes``, the first the fewest steps), and why."""
    candidates = [[Run(size, per_rank // size)] for size in sizes]
    found = fastest_split(candidates, speeds, fewest_is="the fewest that divide the batch")
    if found is None:
        raise AssertionError("the curve was timed at every candidate size")
    chosen, why = found
    return chosen[0].size, why
