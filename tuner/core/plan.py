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
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Literal, NamedTuple, NoReturn, get_args

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from tuner.core.errors import BadInputError, NothingFitsError
from tuner.core.results import AffineFit, ProbeResult
from tuner.core.shape import ONE_PROCESS, MeshShape
from tuner.core.speeds import SpeedCurve

Policy = Literal["balanced", "max", "even", "throughput"]
POLICIES: tuple[str, ...] = get_args(Policy)
DEFAULT_POLICY: Policy = "balanced"
Basis = Literal["measured", "estimated"]

# `even` gives up at most this fraction of the `max` policy's throughput for equal steps.
EVEN_THROUGHPUT_TOLERANCE = 0.05


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


class Recommendation(BaseModel):
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
    # Measured samples per second of each fitting probe up to M*: what an integration that
    # runs equal micro batches only compares its choice with.
    measured_samples_per_second: dict[int, float] = {}
    # Tensor-parallel ranks of the run's mesh (``world_size / tp × tp``); 1 without one.
    tp: int = 1

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
        return self

    @property
    def mesh(self) -> MeshShape:
        """The run's ranks as ``dp × tp``."""
        return MeshShape(self.world_size, self.tp)

    def flat_split(self) -> list[int]:
        """Every micro batch of one step on one rank, in order (``grad_accum`` numbers): what
        a training loop runs. Never sent: the wire carries the runs."""
        return expand(self.split)

    def describe(self) -> str:
        """One sentence a person reads: the settings and how a step splits."""
        ranks = self.mesh.ranks_words()
        steps = f"{self.grad_accum} accumulation step{'s' if self.grad_accum != 1 else ''}"
        if len(self.split) == 1:
            return (
                f"micro batch {self.micro_batch_size} × {steps}{ranks} "
                f"= global batch {self.global_batch_size}"
            )
        return (
            f"micro batch {self.micro_batch_size}, {steps}: "
            f"{format_runs(self.split)} = {self.per_rank_batch_size} samples a step{ranks} "
            f"= global batch {self.global_batch_size}"
        )


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
    """The largest micro batch ``≤ M*`` that divides ``B / W``.

    Frameworks that run equal micro batches only (the Hugging Face Trainer, Lightning)
    keep the global batch exact with it: ``B = micro × (B / W / micro) × W``.
    """
    if max_micro_batch_size < 1:
        raise NothingFitsError("no micro batch size fits on this device")
    for size in range(min(max_micro_batch_size, per_rank_batch_size), 0, -1):
        if per_rank_batch_size % size == 0:
            return size
    raise AssertionError("1 divides every batch size")


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
      instead when the curve has it faster by more than the spread of the timed rounds
      (:func:`fastest_balanced`).
    - ``max``: the largest fitting micro batch, ``min(M*, b)``, then the remainder.
    - ``even``: the largest divisor of ``b`` not above ``M*`` whose throughput is within
      5% of ``max``'s (every micro batch then has the same size).
    - ``throughput``: the fitting probe with the highest measured samples per second.

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
    timed = None
    if policy == "balanced":
        timed = fastest_balanced(per_rank, largest, max_micro_batch_size, speeds)
    if timed is not None:
        split, reason = timed
    else:
        split, reason = _choose(policy, per_rank, largest, max_micro_batch_size, speeds_at)
    micro = split[0].size  # the largest: every policy runs it first
    probe = _probe_at_or_above(probes, micro)
    footprint = probe.footprint_bytes if probe is not None else None
    expected_speed = probe.samples_per_second if probe is not None else None
    spread = None
    timed_speed = speeds.samples_per_second(split) if speeds is not None else None
    if speeds is not None and timed_speed is not None:
        expected_speed, spread = timed_speed, speeds.spread(split)
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
    )


def _choose(
    policy: str, per_rank: int, largest: int, m_star: int, speeds: dict[int, float]
) -> tuple[list[Run], str]:
    """The split ``policy`` takes, as runs, and the one line that says why."""
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
    if policy == "even":
        micro, why = _even_choice(per_rank, largest, speeds)
        return split_runs(per_rank, micro), f"even: {why}"
    split = split_runs(per_rank, largest)
    if len(split) == 1:
        why = f"the largest micro batch that fits, M* = {m_star}, divides {per_rank}"
    else:
        why = (
            f"the largest micro batch that fits, M* = {m_star}, first; "
            f"the remainder {split[-1].size} last"
        )
    return split, f"max: {why}"


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


def fastest_split(
    candidates: list[list[Run]], speeds: SpeedCurve, *, fewest_is: str
) -> tuple[list[Run], str] | None:
    """The candidate split to train, and why; the first is the fewest micro batches, and
    ``None`` when the curve does not cover it.

    The fastest by the curve (:mod:`tuner.core.speeds`; candidates it does not cover are
    left out) replaces the fewest only when its gain, ``T(fewest) / T(fastest) − 1``,
    exceeds the spread of the two: a difference the timing cannot tell from noise changes
    nothing.
    """
    fewest = candidates[0]
    base = speeds.step_seconds(fewest)
    if base is None:
        return None
    seconds = {i: speeds.step_seconds(runs) for i, runs in enumerate(candidates)}
    best = min((i for i, t in seconds.items() if t is not None), key=lambda i: seconds[i] or 0)
    fastest, fastest_seconds = candidates[best], seconds[best] or base
    what = _micro_batches(fewest)
    if best == 0:
        return fewest, f"{what}, {fewest_is}, also the fastest of the splits timed"
    gain = base / fastest_seconds - 1
    noise = max(speeds.spread(fewest), speeds.spread(fastest))
    other = _micro_batches(fastest)
    if gain > noise:
        return fastest, (
            f"{other} train {gain:.0%} faster than the fewest ({what}), more than the "
            f"spread of the timed rounds ({noise:.0%})"
        )
    return fewest, (
        f"{what}, {fewest_is}; {other} timed {gain:.0%} faster, within the spread of the "
        f"timed rounds ({noise:.0%}), which cannot tell them apart"
    )


def _micro_batches(runs: list[Run]) -> str:
    """``16 micro batches of 16``, or ``4 micro batches (2×63 + 2×62)``."""
    count = sum(times for _, times in runs)
    if len(runs) == 1:
        return f"{count} micro batch{'es' if count != 1 else ''} of {runs[0].size}"
    return f"{count} micro batches ({format_runs(runs)})"


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


def _even_choice(per_rank: int, largest: int, speeds: dict[int, float]) -> tuple[int, str]:
    if per_rank % largest == 0:
        return largest, f"the largest micro batch that fits, {largest}, divides {per_rank}"
    reference = speeds.get(largest)
    if reference is None:
        return largest, (
            f"no divisor of {per_rank} up to {largest} has a measured throughput to compare, "
            f"so the largest that fits, {largest}, then the remainder"
        )
    # Only a measured throughput may justify a smaller micro batch.
    for divisor in range(largest - 1, 0, -1):
        if (
            per_rank % divisor == 0
            and speeds.get(divisor, 0.0) >= (1 - EVEN_THROUGHPUT_TOLERANCE) * reference
        ):
            return divisor, (
                f"{divisor} divides {per_rank} and ran within "
                f"{EVEN_THROUGHPUT_TOLERANCE:.0%} of {largest}'s measured throughput"
            )
    return largest, (
        f"no divisor of {per_rank} up to {largest} ran within "
        f"{EVEN_THROUGHPUT_TOLERANCE:.0%} of {largest}'s measured throughput, so {largest}, "
        "then the remainder"
    )
