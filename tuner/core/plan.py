"""From a profile to training settings. Torch-free: the service, the client and the CLI
all call this one module.

    global batch = micro batch × accumulation steps × world size

On a 2-D mesh of ``dp × tp`` ranks the ``tp`` ranks of a data-parallel group share their
samples, so ``global batch = micro batch × accumulation steps × dp`` with
``dp = world size / tp`` (``tp = 1`` without a mesh: the line above).

``split`` is one step on one rank as runs of equal sizes, ``[(size, count), ...]`` in the
order they run: ``Σ size·count = b = B / dp`` and ``Σ count = accumulation steps``. Every
policy yields at most two runs, so an answer's size does not grow with the batch (at
``M* = 1`` and ``B = 2**20`` the flat list would be a million numbers);
``Recommendation.flat_split()`` expands them for a training loop. The default policy,
``balanced``, takes the fewest micro batches that fit, ``k = ⌈b / M*⌉``, and sizes that
differ by at most one: with ``b = q·k + r``, ``r`` micro batches of ``q + 1`` and ``k − r``
of ``q``. It runs as many steps as ``max`` (``M*`` first, the remainder last) with a peak
no higher, usually lower.

``micro_batch_size × grad_accum`` is the per-rank batch only when every micro batch has
the same size; an answer's ``headline`` says the step as it runs, an equation that holds,
and every answer carries the best **equal** split too (``equal``, :func:`best_equal`):
what a framework that runs micro batches of one size trains, with its speed against the
split's and, where it is more than 10% slower, a warning naming the nearest global batches
that split well. Timed speeds choose a split only when the paired, interleaved rounds show
its gain with 95% confidence (:func:`fastest_split`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, NamedTuple, NoReturn, TypeGuard, get_args

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from tuner.core.errors import BadInputError, NothingFitsError
from tuner.core.results import AffineFit, ProbeResult
from tuner.core.shape import ONE_PROCESS, MeshShape
from tuner.core.speeds import SpeedCurve, TimedSize

Policy = Literal["balanced", "max", "even", "throughput"]
POLICIES: tuple[str, ...] = get_args(Policy)
DEFAULT_POLICY: Policy = "balanced"
Basis = Literal["measured", "estimated"]

# An equal split (what a framework that runs equal micro batches only trains) that is more
# than this fraction slower than the split recommended carries a warning naming the
# nearest global batches that split well.
EQUAL_SLOWER_WARNING = 0.10
# Without measured speeds to compare by, an equal split of at least this many times the
# recommended number of micro batches carries the warning; micro batch 1 always does.
EQUAL_MORE_STEPS_WARNING = 2
# A split is chosen for speed only when the paired rounds put its gain above zero with this
# one-sided confidence (Student's t over the rounds' paired gains), and by at least
# MIN_TIMED_GAIN: a smaller gain is not worth another split.
TIMING_CONFIDENCE = 0.95
MIN_TIMED_GAIN = 0.02
# One-sided 95% quantiles of Student's t by degrees of freedom (paired rounds − 1).
_T95 = {
    1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860,
    9: 1.833, 10: 1.812, 11: 1.796, 12: 1.782, 13: 1.771, 14: 1.761, 15: 1.753,
}  # fmt: skip
# How many accumulation counts past the fewest the search for nearby batches tries.
_NEARBY_COUNTS = 64


class Run(NamedTuple):
    """``times`` micro batches of ``size`` samples each, one after another; JSON
    ``[size, count]``."""

    size: int
    times: int  # not `count`, which would hide tuple.count


def runs_of(split: Iterable[int]) -> list[Run]:
    """Runs of equal sizes: ``[12, 12, 12, 4]`` is ``[Run(12, 3), Run(4, 1)]``."""
    return _runs(*((size, 1) for size in split))


def expand(runs: Iterable[tuple[int, int]]) -> list[int]:
    """Every micro batch of the runs, in order: ``Σ count`` numbers."""
    return [size for size, count in runs for _ in range(count)]


def _runs(*candidates: tuple[int, int]) -> list[Run]:
    """``candidates`` as runs, empty ones left out and equal neighbours merged."""
    runs: list[Run] = []
    for size, count in candidates:
        if count < 1:
            continue
        if runs and runs[-1].size == size:
            runs[-1] = Run(size, runs[-1].times + count)
        else:
            runs.append(Run(size, count))
    return runs


class NearbyBatch(BaseModel):
    """A global batch near the one asked whose equal split trains about as fast as its
    recommended split: ``micro_batch_size × grad_accum × dp = global_batch_size``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    global_batch_size: int
    micro_batch_size: int
    grad_accum: int
    expected_samples_per_second: float | None = None


class EqualSplit(BaseModel):
    """The best split whose micro batches all have the same size, what a framework that
    runs equal micro batches only (the Hugging Face Trainer, Lightning) trains:
    ``micro_batch_size × grad_accum × dp = B`` exactly."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    micro_batch_size: int
    grad_accum: int
    # Samples per second of a step on one rank, by the same speeds the recommended split's
    # comparison uses; None where no speed is known.
    expected_samples_per_second: float | None = None
    # measured: read off timed sizes (or between them); estimated: extrapolated below or
    # above them. None without a speed.
    speed_basis: Basis | None = None
    # 1 − this split's speed / the recommended split's (0 when they are the same split);
    # None where either speed is unknown.
    slower_by: float | None = None
    # Said to whoever trains this split, once: it is much slower than the recommended one
    # (or, speeds unknown, runs many more micro batches); None when it is not.
    warning: str | None = None
    # Where ``warning`` is set: the nearest global batches below and above that split well.
    nearby: list[NearbyBatch] = []
    # The split as a framework's settings, an equation that holds (filled in by the answer).
    headline: str = ""


class Recommendation(BaseModel):
    """The split of one optimizer step: ``Σ size·count`` of ``split`` on each of the ``dp``
    data-parallel groups makes the global batch. ``micro_batch_size`` is the split's largest
    micro batch (the one its peak is of) and ``grad_accum`` its number of micro batches:
    their product is the per-rank batch only when the split is equal. ``headline`` says the
    step as it runs; ``equal`` is the best equal split, for frameworks."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    micro_batch_size: int
    grad_accum: int
    # Runs of equal sizes, ``[[size, count], ...]``: at most two, whatever the batch. A flat
    # list of sizes is read too (answers kept by earlier versions) and kept as runs.
    split: list[Run]
    global_batch_size: int
    world_size: int
    per_rank_batch_size: int
    policy: Policy
    max_micro_batch_size: int
    expected_peak_bytes: int | None
    expected_samples_per_second: float | None
    basis: Basis
    # How far apart the timed rounds behind ``expected_samples_per_second`` lay, as a
    # fraction of it (``tuner.core.speeds``); None where the speed is a single probe's.
    expected_speed_spread: float | None = None
    # Device capacity less the expected footprint; None where either is unknown.
    expected_headroom_bytes: int | None = None
    # Why the policy chose this split, in one line a person reads.
    reason: str = ""
    # Measured samples per second of each fitting probe up to M*.
    measured_samples_per_second: dict[int, float] = {}
    # Tensor-parallel ranks of the run's mesh (``world_size / tp × tp``); 1 without one.
    tp: int = 1
    # The step as it runs, an equation that holds: ``micro batch 64 × 4 accumulation steps
    # = global batch 256``, ``2×15 + 7×14 = 128 samples a step × 2 ranks = global batch
    # 256``. Always derived from the split, whatever a document says.
    headline: str = ""
    # The best equal split (derived without speeds from an answer kept by an earlier version).
    equal: EqualSplit

    @model_validator(mode="before")
    @classmethod
    def _derived(cls, data: Any) -> Any:
        """``headline`` from the split, and ``equal`` where a document has none."""
        if not isinstance(data, dict):
            return data
        found = _step_of(data)
        if found is None:
            return data  # the fields' own validation says what is wrong
        runs, mesh, global_batch, largest = found
        data = dict(data)
        data["headline"] = headline(runs, mesh=mesh, global_batch_size=global_batch)
        equal = data.get("equal")
        if equal is None:
            per_rank = sum(size * count for size, count in runs)
            micro = largest_equal_micro_batch(per_rank, max(1, min(largest, per_rank)))
            equal = EqualSplit(micro_batch_size=micro, grad_accum=per_rank // micro)
        if isinstance(equal, EqualSplit):
            equal = equal.model_dump()
        if isinstance(equal, dict) and isinstance(equal.get("micro_batch_size"), int):
            micro = equal["micro_batch_size"]
            equal = {
                **equal,
                "headline": headline(
                    [Run(micro, equal.get("grad_accum", 0))],
                    mesh=mesh,
                    global_batch_size=global_batch,
                ),
            }
        data["equal"] = equal
        return data

    @field_validator("split", mode="before")
    @classmethod
    def _as_runs(cls, split: Any) -> Any:
        if isinstance(split, list) and split and all(isinstance(s, int) for s in split):
            return runs_of(split)
        return split

    @model_validator(mode="after")
    def _runs_add_up(self) -> Recommendation:
        # The runs are what a training loop expands: they must be the step the other
        # fields describe, or ``flat_split()`` could run anything a document claims.
        if not self.split or any(size < 1 or count < 1 for size, count in self.split):
            raise ValueError("split must be runs [size, count] of positive numbers")
        if sum(count for _, count in self.split) != self.grad_accum:
            raise ValueError(f"split's counts must add up to grad_accum {self.grad_accum}")
        if sum(size * count for size, count in self.split) != self.per_rank_batch_size:
            raise ValueError(
                f"split must hold per_rank_batch_size {self.per_rank_batch_size} samples"
            )
        equal = self.equal
        if equal.micro_batch_size < 1 or (
            equal.micro_batch_size * equal.grad_accum != self.per_rank_batch_size
        ):
            raise ValueError(
                "equal must be micro batches of one size that hold per_rank_batch_size "
                f"{self.per_rank_batch_size} samples"
            )
        return self

    @property
    def mesh(self) -> MeshShape:
        """The run's ranks as ``dp × tp``."""
        return MeshShape(self.world_size, self.tp)

    @property
    def is_equal(self) -> bool:
        """Whether every micro batch of the split has the same size."""
        return len(self.split) == 1

    def flat_split(self) -> list[int]:
        """Every micro batch of one step on one rank, in order (``grad_accum`` numbers): what
        a training loop runs. Never sent: the wire carries the runs."""
        return expand(self.split)

    def describe(self) -> str:
        """One sentence a person reads: the step as it runs (:attr:`headline`)."""
        return self.headline


def headline(runs: Sequence[tuple[int, int]], *, mesh: MeshShape, global_batch_size: int) -> str:
    """The step as it runs, an equation that holds.

    One size: ``micro batch 64 × 4 accumulation steps × 2 ranks = global batch 512``,
    the settings a framework takes. Sizes that differ: the runs, ``count×size``, and the
    samples they hold, ``2×15 + 7×14 = 128 samples a step × 2 ranks = global batch 256``.
    """
    ranks = mesh.ranks_words()
    if len(runs) == 1:
        size, count = runs[0]
        steps = f"{count} accumulation step{'s' if count != 1 else ''}"
        return f"micro batch {size} × {steps}{ranks} = global batch {global_batch_size}"
    per_rank = sum(size * count for size, count in runs)
    return (
        f"{format_runs(runs)} = {per_rank} samples a step{ranks} = global batch {global_batch_size}"
    )


def _step_of(data: dict[str, Any]) -> tuple[list[Run], MeshShape, int, int] | None:
    """The runs, mesh, global batch and M* of a document, or ``None`` where one of them is
    missing or malformed."""
    raw = data.get("split")
    global_batch = data.get("global_batch_size")
    world = data.get("world_size")
    largest = data.get("max_micro_batch_size")
    tp = data.get("tp", 1)
    if not (isinstance(raw, list) and raw):
        return None
    if not (_whole(global_batch) and _whole(world) and _whole(largest) and _whole(tp)):
        return None
    if all(_whole(s) for s in raw):
        runs = runs_of(raw)
    elif all(
        isinstance(r, list | tuple) and len(r) == 2 and all(_whole(v) for v in r) for r in raw
    ):
        runs = [Run(int(size), int(count)) for size, count in raw]
    else:
        return None
    if any(s < 1 or c < 1 for s, c in runs):
        return None
    try:
        mesh = MeshShape(world, tp)  # the shape's own rules (tp divides the world)
    except BadInputError:
        return None
    return runs, mesh, global_batch, largest


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def format_runs(runs: Iterable[tuple[int, int]]) -> str:
    """``[(12, 3), (4, 1)]`` reads ``3×12 + 4``."""
    return " + ".join(f"{count}×{size}" if count > 1 else str(size) for size, count in runs)


def format_split(split: Sequence[int]) -> str:
    """Runs of equal sizes: ``[12, 12, 12, 4]`` reads ``3×12 + 4``, ``[29, 29, 28]``
    reads ``2×29 + 28``."""
    return format_runs(runs_of(split))


def split_runs(per_rank_batch_size: int, micro_batch_size: int) -> list[Run]:
    """Full micro batches, then the remainder if any (``max``): ``a = ⌈b / m⌉`` micro
    batches, ``a − 1`` of ``m`` and one of ``b − m·(a − 1)``."""
    accum = math.ceil(per_rank_batch_size / micro_batch_size)
    last = per_rank_batch_size - micro_batch_size * (accum - 1)
    return _runs((micro_batch_size, accum - 1), (last, 1))


def split_batch(per_rank_batch_size: int, micro_batch_size: int) -> list[int]:
    """Micro batch sizes of one step: full ones, then the remainder if any (``max``)."""
    return expand(split_runs(per_rank_batch_size, micro_batch_size))


def balanced_runs(per_rank_batch_size: int, max_micro_batch_size: int) -> list[Run]:
    """The fewest micro batches of at most ``M*``, sizes within one of each other.

    ``k = ⌈b / M*⌉``, ``b = q·k + r``: ``r`` micro batches of ``q + 1``, then ``k − r``
    of ``q``. Each is at most ``M*`` because ``q + 1 ≤ ⌈b / k⌉ ≤ M*`` whenever ``r > 0``.
    """
    accum = math.ceil(per_rank_batch_size / max_micro_batch_size)
    quotient, remainder = divmod(per_rank_batch_size, accum)
    return _runs((quotient + 1, remainder), (quotient, accum - remainder))


def balanced_split(per_rank_batch_size: int, max_micro_batch_size: int) -> list[int]:
    """:func:`balanced_runs`, every micro batch listed."""
    return expand(balanced_runs(per_rank_batch_size, max_micro_batch_size))


def largest_equal_micro_batch(per_rank_batch_size: int, max_micro_batch_size: int) -> int:
    """The largest micro batch ``≤ M*`` that divides ``B / dp``: the fewest equal micro
    batches, ``B = micro × (B / dp / micro) × dp`` exactly."""
    if max_micro_batch_size < 1:
        raise NothingFitsError("no micro batch size fits on this device")
    return divisors(per_rank_batch_size, max_micro_batch_size)[-1]


def divisors(number: int, limit: int) -> list[int]:
    """The divisors of ``number`` up to ``limit``, smallest first (``O(√number)``)."""
    found: set[int] = set()
    low = 1
    while low * low <= number:
        if number % low == 0:
            found.update((low, number // low))
        low += 1
    return sorted(d for d in found if d <= limit)


def per_rank_batch(global_batch_size: int, mesh: MeshShape = ONE_PROCESS) -> int:
    """``B / dp`` (``dp = W / tp``; ``B / W`` without a mesh), refusing values that cannot
    keep the global batch exact."""
    return mesh.per_group_batch(global_batch_size)


def recommend(
    *,
    max_micro_batch_size: int,
    probes: Sequence[ProbeResult],
    global_batch_size: int,
    mesh: MeshShape = ONE_PROCESS,
    policy: str = DEFAULT_POLICY,
    basis: Basis = "measured",
    capacity_bytes: int | None = None,
    speeds: SpeedCurve | None = None,
) -> Recommendation:
    """Choose the micro batch and accumulation steps for ``B`` samples over ``W`` ranks.

    - ``balanced`` (default): ``k = ⌈b / M*⌉`` micro batches whose sizes differ by at most
      one (``balanced_runs``): as few steps as ``max``, a peak no higher. With a speed
      curve (``speeds``, timed after ``M*``), a split into more, smaller micro batches
      instead when the paired timed rounds have it faster with 95% confidence
      (:func:`fastest_split`).
    - ``max``: the largest fitting micro batch, ``min(M*, b)``, then the remainder.
    - ``even``: the best equal split (:func:`best_equal`): every micro batch the same size.
    - ``throughput``: the fitting probe with the highest measured samples per second.

    Every answer carries the best equal split too (``equal``), with its speed compared with
    the chosen split's, and a warning naming nearby global batches that split well where it
    is more than 10% slower.

    The expected peak is that of the probe at the chosen micro batch, else of the smallest
    larger size that was probed and fit: a measured upper bound on the peak. The expected
    speed is the curve's for the whole step where it covers the split, else the probe's.
    """
    if policy not in POLICIES:
        raise BadInputError(f"unknown policy {policy!r}: use one of {', '.join(POLICIES)}")
    per_rank = per_rank_batch(global_batch_size, mesh)
    if max_micro_batch_size < 1:
        raise NothingFitsError(
            "no micro batch size fits on this device, so no recommendation can be made"
        )
    largest = min(max_micro_batch_size, per_rank)
    speeds_at = _measured_speeds(probes)
    equal_runs, equal_why = best_equal(per_rank, largest, speeds)
    timed = None
    if policy == "balanced":
        timed = fastest_balanced(per_rank, largest, max_micro_batch_size, speeds)
    if timed is not None:
        split, reason = timed
    elif policy == "even":
        split, reason = equal_runs, f"even: {equal_why}"
    else:
        split, reason = _choose(policy, per_rank, largest, max_micro_batch_size, speeds_at)
    if len(split) == 1:
        equal_runs = split  # equal already: the split a framework runs is this one
    micro = split[0].size  # the largest: every policy runs it first
    probe = _probe_at_or_above(probes, micro)
    footprint = probe.footprint_bytes if probe is not None else None
    expected_speed = probe.samples_per_second if probe is not None else None
    spread = None
    timed_speed = speeds.samples_per_second(split) if speeds is not None else None
    if speeds is not None and timed_speed is not None:
        expected_speed, spread = timed_speed, speeds.spread(split)
    rates = SplitSpeeds(speeds, speeds_at)
    equal = rates.equal_split(
        equal_runs[0],
        chosen=split,
        chosen_speed=expected_speed,
        m_star=largest,
        mesh=mesh,
        global_batch_size=global_batch_size,
    )
    return Recommendation(
        micro_batch_size=micro,
        grad_accum=sum(count for _, count in split),
        split=split,
        global_batch_size=global_batch_size,
        world_size=mesh.world_size,
        per_rank_batch_size=per_rank,
        policy=policy,  # type: ignore[arg-type]
        max_micro_batch_size=max_micro_batch_size,
        expected_peak_bytes=probe.peak_bytes if probe is not None else None,
        expected_samples_per_second=expected_speed,
        basis=basis,
        expected_speed_spread=spread,
        expected_headroom_bytes=(
            capacity_bytes - footprint
            if capacity_bytes is not None and footprint is not None
            else None
        ),
        reason=reason,
        measured_samples_per_second={
            m: v for m, v in speeds_at.items() if m <= max_micro_batch_size
        },
        tp=mesh.tp,
        equal=equal,
    )


def _choose(
    policy: str, per_rank: int, largest: int, m_star: int, speeds: dict[int, float]
) -> tuple[list[Run], str]:
    """The split ``policy`` takes (``balanced``, ``max``, ``throughput``), as runs, and the
    one line that says why."""
    fewest = math.ceil(per_rank / largest)
    if per_rank <= m_star and policy != "throughput":
        why = f"the whole batch of {per_rank} fits in one micro batch (M* = {m_star})"
        return [Run(per_rank, 1)], f"{policy}: {why}"
    if policy == "balanced":
        split = balanced_runs(per_rank, largest)
        if len(split) == 1:
            why = (
                f"{fewest} equal micro batches of {split[0].size}, the fewest that fit "
                f"M* = {m_star}"
            )
        else:
            peak = (
                f"so the peak is that of {split[0].size}, not of {m_star}"
                if split[0].size < m_star
                else "so the peak is that of M* itself"
            )
            why = (
                f"the fewest micro batches that fit M* = {m_star} (⌈{per_rank} / {m_star}⌉ = "
                f"{fewest}), sizes within one of each other ({format_runs(split)}), {peak}"
            )
        return split, f"balanced: {why}"
    if policy == "throughput":
        fastest = max((m for m in speeds if m <= largest), key=speeds.__getitem__, default=None)
        if fastest is None:
            why = f"no throughput was measured, so the largest that fits, M* = {m_star}"
            return split_runs(per_rank, largest), f"throughput: {why}"
        why = (
            f"micro batch {fastest} ran fastest of the probes that fit "
            f"({speeds[fastest]:.1f} samples/s)"
        )
        return split_runs(per_rank, fastest), f"throughput: {why}"
    split = split_runs(per_rank, largest)
    if len(split) == 1:
        why = f"the largest micro batch that fits, M* = {m_star}, divides {per_rank}"
    else:
        why = (
            f"the largest micro batch that fits, M* = {m_star}, first; "
            f"the remainder {split[-1].size} last"
        )
    return split, f"max: {why}"


def best_equal(per_rank: int, largest: int, speeds: SpeedCurve | None) -> tuple[list[Run], str]:
    """The best split into micro batches of one size (a divisor of ``b`` up to ``largest``),
    and why: the fewest, unless the paired timed rounds have a split into more, smaller
    ones faster with 95% confidence (:func:`fastest_split`)."""
    sizes = divisors(per_rank, largest)
    fewest = [Run(sizes[-1], per_rank // sizes[-1])]
    count = fewest[0].times
    why = (
        f"{_micro_batches(fewest)}, the fewest equal micro batches that fit "
        f"(the largest divisor of {per_rank} up to {largest})"
    )
    if count == 1:
        why = f"the whole batch of {per_rank} in one micro batch"
    if speeds is None:
        return fewest, why
    candidates = [fewest] + [
        [Run(size, per_rank // size)] for size in reversed(sizes[:-1]) if speeds.covers(size)
    ]
    found = fastest_split(candidates, speeds, fewest_is="the fewest equal micro batches that fit")
    if found is None or found[0] is fewest:
        return fewest, why
    return found


def fastest_balanced(
    per_rank: int, largest: int, m_star: int, speeds: SpeedCurve | None
) -> tuple[list[Run], str] | None:
    """The balanced split the speed curve trains fastest, and why; ``None`` without a
    curve that covers the fewest-steps split (then ``balanced`` is the fewest).

    The candidates are the fewest micro batches that fit, ``balanced_runs(b, M*)``, and
    for each timed size ``s`` below it the balanced split into ``⌈b / s⌉`` micro batches,
    compared by :func:`fastest_split`.
    """
    if speeds is None:
        return None
    fewest = balanced_runs(per_rank, largest)
    candidates = [fewest]
    for timed in speeds.sizes:
        runs = balanced_runs(per_rank, timed.micro_batch_size)
        if timed.micro_batch_size < fewest[0].size and runs not in candidates:
            candidates.append(runs)
    found = fastest_split(candidates, speeds, fewest_is=f"the fewest that fit M* = {m_star}")
    if found is None:
        return None
    chosen, why = found
    timed_note = ", timed" if chosen is not fewest else ""
    return chosen, f"balanced{timed_note}: {why}"


def paired_gains(speeds: SpeedCurve, fewest: list[Run], other: list[Run]) -> list[float]:
    """Round by round, how much faster ``other`` trains than ``fewest``,
    ``T_r(fewest) / T_r(other) − 1``: the sizes were timed in interleaved rounds, so round
    ``r`` of each met the same load, and the pair cancels it. Empty where the curve does not
    cover both."""
    rounds = min(len(t.seconds_per_sample) for t in speeds.sizes)
    gains = []
    for r in range(rounds):
        one_round = SpeedCurve(
            sizes=[
                TimedSize(
                    micro_batch_size=t.micro_batch_size,
                    seconds_per_sample=[t.seconds_per_sample[r]],
                )
                for t in speeds.sizes
            ],
            optimizer_seconds=speeds.optimizer_seconds,
        )
        base, seconds = one_round.step_seconds(fewest), one_round.step_seconds(other)
        if base is None or seconds is None or seconds <= 0:
            return []
        gains.append(base / seconds - 1)
    return gains


def confident_gain(gains: Sequence[float]) -> float | None:
    """The lower 95% confidence bound of the mean paired gain (Student's t, one-sided);
    ``None`` with fewer than two rounds, which state no confidence."""
    n = len(gains)
    if n < 2:
        return None
    mean = sum(gains) / n
    deviation = math.sqrt(sum((g - mean) ** 2 for g in gains) / (n - 1))
    return mean - _T95.get(n - 1, 1.645) * deviation / math.sqrt(n)


def fastest_split(
    candidates: list[list[Run]], speeds: SpeedCurve, *, fewest_is: str
) -> tuple[list[Run], str] | None:
    """The candidate split to train, and why; the first is the fewest micro batches, and
    ``None`` when the curve does not cover it.

    A candidate replaces the fewest only when the paired interleaved rounds put its gain,
    ``T(fewest) / T(candidate) − 1``, above zero with 95% confidence, by at least 2% on
    average and in every round: a difference the timing cannot tell from noise changes
    nothing. Of those that do, the one with the largest mean gain.
    """
    fewest = candidates[0]
    if speeds.step_seconds(fewest) is None:
        return None
    what = _micro_batches(fewest)
    rounds = min(len(t.seconds_per_sample) for t in speeds.sizes)
    best: tuple[float, float, list[float], list[Run]] | None = None
    closest: tuple[float, list[float], list[Run]] | None = None
    for runs in candidates[1:]:
        gains = paired_gains(speeds, fewest, runs)
        if not gains:
            continue
        mean = sum(gains) / len(gains)
        if closest is None or mean > closest[0]:
            closest = (mean, gains, runs)
        bound = confident_gain(gains)
        if bound is None or bound <= 0 or mean < MIN_TIMED_GAIN or min(gains) <= 0:
            continue
        if best is None or mean > best[0]:
            best = (mean, bound, gains, runs)
    if best is not None:
        mean, bound, gains, runs = best
        return runs, (
            f"{_micro_batches(runs)} train {mean:.0%} faster than the fewest ({what}) over "
            f"{len(gains)} paired timed rounds, at least {bound:.0%} with "
            f"{TIMING_CONFIDENCE:.0%} confidence"
        )
    if closest is None or closest[0] <= 0:
        return fewest, f"{what}, {fewest_is}, also the fastest of the splits timed"
    mean, gains, runs = closest
    bound = confident_gain(gains)
    if rounds < 2:
        doubt = "one timed round states no confidence"
    elif bound is not None and bound > 0 and min(gains) > 0:
        doubt = f"less than the {MIN_TIMED_GAIN:.0%} worth another split"
    else:
        doubt = (
            f"which {len(gains)} paired timed rounds (gains {min(gains):+.0%} to "
            f"{max(gains):+.0%}) do not show with {TIMING_CONFIDENCE:.0%} confidence"
        )
    return fewest, (f"{what}, {fewest_is}; {_micro_batches(runs)} timed {mean:.0%} faster, {doubt}")


def _micro_batches(runs: list[Run]) -> str:
    """``16 micro batches of 16``, or ``4 micro batches (2×63 + 2×62)``."""
    count = sum(times for _, times in runs)
    if len(runs) == 1:
        return f"{count} micro batch{'es' if count != 1 else ''} of {runs[0].size}"
    return f"{count} micro batches ({format_runs(runs)})"


class SplitSpeeds:
    """The one speed model an answer compares its splits by: the timed curve where it
    covers a split (``measured``); else a micro batch's time ``t(m) = m·s(m)`` extrapolated
    along the line through the two nearest timed sizes, never faster per sample than the
    nearest timed size and never slower than a larger one (``estimated``); without a curve,
    the probes' measured speeds the same way; ``None`` with fewer than two speeds to
    draw a line through (one size says nothing about another)."""

    def __init__(self, curve: SpeedCurve | None, measured: Mapping[int, float]) -> None:
        self.curve = curve
        if curve is not None:
            points = [(t.micro_batch_size, t.micro_batch_size * t.best) for t in curve.sizes]
            self.overhead = curve.optimizer_seconds
        else:
            points = [(m, m / v) for m, v in sorted(measured.items()) if v > 0]
            self.overhead = 0.0
        self.points = sorted(points)

    def of(self, runs: Sequence[tuple[int, int]]) -> tuple[float | None, Basis | None]:
        """Samples per second of one step on one rank, and whether it is measured."""
        if self.curve is not None:
            covered = self.curve.samples_per_second(runs)
            if covered is not None:
                return covered, "measured"
        sizes = dict(self.points)
        if self.curve is None and all(size in sizes for size, _ in runs):
            basis: Basis = "measured"
        elif len(self.points) >= 2:
            basis = "estimated"
        else:
            return None, None
        seconds = self.overhead + sum(count * self._micro_seconds(size) for size, count in runs)
        samples = sum(size * count for size, count in runs)
        return (samples / seconds if seconds > 0 else None), basis

    def _micro_seconds(self, size: int) -> float:
        points = self.points
        exact = dict(points).get(size)
        if exact is not None:
            return exact
        below = [p for p in points if p[0] < size]
        above = [p for p in points if p[0] > size]
        if below and above:
            (m0, t0), (m1, t1) = below[-1], above[0]
            return t0 + (t1 - t0) * (size - m0) / (m1 - m0)
        if above:  # smaller than every timed size
            (m0, t0), (m1, t1) = points[0], points[1]
            line = t0 + (t1 - t0) * (size - m0) / (m1 - m0)
            return min(max(line, size * t0 / m0), t0)
        (m0, t0), (m1, t1) = points[-2], points[-1]
        line = t0 + (t1 - t0) * (size - m0) / (m1 - m0)
        return max(min(line, size * t1 / m1), t1)

    def splits_well(self, per_rank: int, m_star: int) -> tuple[bool, list[Run], float | None]:
        """Whether the fewest equal micro batches of ``per_rank`` train within 10% of its
        fewest balanced split (speeds unknown: as few micro batches), that split, its speed."""
        largest = min(m_star, per_rank)
        micro = largest_equal_micro_batch(per_rank, largest)
        equal = [Run(micro, per_rank // micro)]
        fewest = balanced_runs(per_rank, largest)
        speed, _ = self.of(equal)
        reference, _ = self.of(fewest)
        if speed is None or reference is None:
            ok = equal[0].times <= sum(count for _, count in fewest)
        else:
            ok = speed >= (1 - EQUAL_SLOWER_WARNING) * reference
        return ok, equal, speed

    def equal_split(
        self,
        equal: Run,
        *,
        chosen: list[Run],
        chosen_speed: float | None,
        m_star: int,
        mesh: MeshShape,
        global_batch_size: int,
    ) -> EqualSplit:
        """The answer's equal split: its speed against the chosen split's, and where it is
        much slower, the warning and the nearby global batches that split well."""
        if [equal] == chosen:
            return EqualSplit(
                micro_batch_size=equal.size,
                grad_accum=equal.times,
                expected_samples_per_second=chosen_speed,
                speed_basis="measured" if chosen_speed is not None else None,
                slower_by=0.0,
            )
        speed, basis = self.of([equal])
        reference, _ = self.of(chosen)
        slower = 1 - speed / reference if speed is not None and reference else None
        # Where both were timed, by the paired rounds (their median): each size's fastest
        # round may have met another load.
        paired = paired_gains(self.curve, [equal], chosen) if self.curve is not None else []
        if len(paired) >= 2:
            slower = 1 - 1 / (1 + statistics.median(paired))
        chosen_count = sum(count for _, count in chosen)
        many = equal.times >= EQUAL_MORE_STEPS_WARNING * chosen_count
        # An extrapolated speed may miss what many small micro batches cost: with twice as
        # many, the split is said whatever the estimate; and micro batch 1 always is.
        warn = (
            many
            if slower is None
            else slower > EQUAL_SLOWER_WARNING or (many and basis == "estimated")
        ) or equal.size == 1
        found = EqualSplit(
            micro_batch_size=equal.size,
            grad_accum=equal.times,
            expected_samples_per_second=speed,
            speed_basis=basis,
            slower_by=slower,
        )
        if not warn:
            return found
        nearby = self.nearby(sum(s * c for s, c in chosen), m_star, mesh)
        runs = format_runs(chosen)
        rates = (
            f"{_rate(speed)} against {_rate(reference)} samples/s at their fastest rounds, "
            f"the median of {len(paired)} paired rounds {slower:.0%} slower"
            if len(paired) >= 2 and slower is not None
            else f"{_rate(speed)} against {_rate(reference)} samples/s"
            + (", estimated" if basis == "estimated" else "")
        )
        how = (
            f"about {slower:.0%} slower than {runs} ({rates})"
            if slower is not None
            else f"{equal.times} micro batches where {runs} runs {chosen_count} (speeds not "
            "measured)"
        )
        near = "; ".join(
            f"global batch {n.global_batch_size} splits well: micro batch "
            f"{n.micro_batch_size} × {n.grad_accum}"
            + (
                f" at {_rate(n.expected_samples_per_second)} samples/s"
                if n.expected_samples_per_second is not None
                else ""
            )
            for n in nearby
        )
        warning = (
            f"equal micro batches for global batch {global_batch_size} are micro batch "
            f"{equal.size} × {equal.times} accumulation steps, {how}"
            + (f"; {near}" if near else "")
        )
        return found.model_copy(update={"warning": warning, "nearby": nearby})

    def nearby(self, per_rank: int, m_star: int, mesh: MeshShape) -> list[NearbyBatch]:
        """The nearest global batch below and above ``per_rank × dp`` whose equal split
        trains within 10% of its balanced one: each ``k·⌊b/k⌋`` or ``k·⌈b/k⌉`` for ``k``
        from the fewest micro batches ``⌈b / M*⌉`` up, ``k·M*`` for ``k`` below it, and every
        batch within 64 of ``b`` (bounded)."""
        largest = min(m_star, per_rank)
        fewest = math.ceil(per_rank / largest)
        candidates: set[int] = set()
        for k in range(fewest, min(per_rank, fewest + _NEARBY_COUNTS) + 1):
            candidates.update((k * (per_rank // k), k * -(-per_rank // k)))
        # Fewer micro batches of M* each, below the batch: k·M* for k < ⌈b / M*⌉.
        candidates.update(k * largest for k in range(max(1, fewest - _NEARBY_COUNTS), fewest))
        # And every batch close by.
        candidates.update(range(max(1, per_rank - _NEARBY_COUNTS), per_rank + _NEARBY_COUNTS + 1))
        candidates.discard(per_rank)
        candidates.discard(0)
        found: dict[str, NearbyBatch] = {}
        for b in sorted(candidates, key=lambda b: (abs(b - per_rank), b)):
            side = "below" if b < per_rank else "above"
            if side in found:
                continue
            ok, equal, speed = self.splits_well(b, m_star)
            if ok:
                found[side] = NearbyBatch(
                    global_batch_size=b * mesh.dp,
                    micro_batch_size=equal[0].size,
                    grad_accum=equal[0].times,
                    expected_samples_per_second=speed,
                )
            if len(found) == 2:
                break
        return [found[side] for side in ("below", "above") if side in found]


def _rate(value: float | None) -> str:
    return "?" if value is None else f"{value:,.1f}"


def below_oom(max_micro_batch_size: int, oom_limit: int | None) -> int:
    """``M*`` once training reported running out of memory at ``oom_limit``: below it."""
    if oom_limit is None:
        return max_micro_batch_size
    return max(0, min(max_micro_batch_size, oom_limit - 1))


def estimate_max_micro_batch(
    fit: AffineFit, capacity_bytes: int, headroom: float, *, size_cap: int | None = None
) -> int:
    """``M*`` on a device that was never profiled, from another device's affine fit: the
    largest ``m`` with ``fixed + slope·m ≤ (1 − headroom) × capacity``, at most ``size_cap``
    (the search never looks above it, so neither does the estimate)."""
    if not 0 <= headroom < 1:
        raise BadInputError(f"headroom {headroom} is outside [0, 1): give e.g. 0.05")
    if fit.bytes_per_sample <= 0:
        raise BadInputError(
            "the fit has no positive bytes per sample, so it cannot estimate a largest size: "
            "profile the workload on this device instead"
        )
    budget = (1 - headroom) * capacity_bytes
    # A tiny slope would put the quotient past any integer; the cap bounds it first.
    if size_cap is not None and budget - fit.fixed_bytes >= fit.bytes_per_sample * (size_cap + 1):
        return size_cap
    return fit.largest_fitting(budget)


def recommend_measured(
    *,
    max_micro_batch_size: int,
    probes: Sequence[ProbeResult],
    capacity_bytes: int | None = None,
    global_batch_size: int,
    mesh: MeshShape = ONE_PROCESS,
    policy: str = DEFAULT_POLICY,
    oom_limit: int | None = None,
    speeds: SpeedCurve | None = None,
) -> Recommendation:
    """The recommendation from a profile of this very device (its ``M*``, probes and speed
    curve), kept below a micro batch that ran out of memory in training."""
    largest = below_oom(max_micro_batch_size, oom_limit)
    if largest < 1:
        _nothing_fits(max_micro_batch_size, oom_limit, estimated=False)
    return recommend(
        max_micro_batch_size=largest,
        probes=probes,
        global_batch_size=global_batch_size,
        mesh=mesh,
        policy=policy,
        capacity_bytes=capacity_bytes,
        speeds=speeds,
    )


def recommend_estimated(
    fit: AffineFit,
    *,
    capacity_bytes: int,
    headroom: float,
    size_cap: int | None = None,
    global_batch_size: int,
    mesh: MeshShape = ONE_PROCESS,
    policy: str = DEFAULT_POLICY,
    oom_limit: int | None = None,
) -> Recommendation:
    """The recommendation for a device never profiled, from another device's fit.

    Throughput does not carry over between devices, so every policy falls back to ``max``'s
    choice among sizes with unknown speed; the expected peak is the fit's footprint.
    """
    estimated = estimate_max_micro_batch(fit, capacity_bytes, headroom, size_cap=size_cap)
    largest = below_oom(estimated, oom_limit)
    if largest < 1:
        _nothing_fits(estimated, oom_limit, estimated=True)
    chosen = recommend(
        max_micro_batch_size=largest,
        probes=(),
        global_batch_size=global_batch_size,
        mesh=mesh,
        policy=policy,
        basis="estimated",
    )
    peak = round(fit.predict(chosen.micro_batch_size))
    return chosen.model_copy(
        update={"expected_peak_bytes": peak, "expected_headroom_bytes": capacity_bytes - peak}
    )


def _nothing_fits(found: int, oom_limit: int | None, *, estimated: bool) -> NoReturn:
    if found >= 1:
        raise NothingFitsError(
            f"training reported running out of memory at micro batch {oom_limit}, so no "
            "smaller size is left: profile the workload on this device again (a newer "
            "profile lifts the limit), or reduce memory per sample"
        )
    if estimated:
        raise NothingFitsError(
            "estimated from another device's fit, not even a micro batch of 1 fits this "
            "device's memory: profile the workload on this device to measure it, or use a "
            "larger device"
        )
    raise NothingFitsError(
        "the profile found that not even a micro batch of 1 fits on this device: reduce "
        "memory per sample (activation checkpointing, lower precision, shorter inputs) or "
        "use a device with more memory"
    )


def _measured_speeds(probes: Sequence[ProbeResult]) -> dict[int, float]:
    return {
        p.micro_batch_size: p.samples_per_second
        for p in probes
        if p.fits and p.samples_per_second is not None
    }


def _probe_at_or_above(probes: Sequence[ProbeResult], micro_batch_size: int) -> ProbeResult | None:
    """The last fitting probe of the smallest probed size ``≥ micro_batch_size``."""
    sizes = [
        p.micro_batch_size for p in probes if p.fits and p.micro_batch_size >= micro_batch_size
    ]
    if not sizes:
        return None
    nearest = min(sizes)
    return [p for p in probes if p.micro_batch_size == nearest and p.fits][-1]
