"""The memory/speed trade-off, measured: profile each variant a workload declares
(activation checkpointing, precision, ...) and pick the fastest that keeps ``B`` exact.

Each variant gets the same search and a profile of its own; the profiles share a
``variant_group``. Each variant's profile times its micro batches after ``M*``
(:mod:`tuner.engine.speeds`; the speed curve of :mod:`tuner.core.speeds`, kept with the
profile), and its plan for ``B`` is the one the answer gives from that curve, the fastest
split of its own; a variant's speed is that plan's, per rank, with the spread of its
timed rounds::

    samples/s = (B / W) / (Σ m_i · s(m_i) + t_opt)
    spread    = 1 − fastest round / slowest round       (of the sizes the plan runs)

The variant as loaded stays the answer unless another is faster by more than the spread
of the two (a difference the timing cannot tell from noise changes nothing the user
chose); when the variant as loaded does not fit, the fastest that fits is the answer.
Without a curve (a variant measured on ranks) its plan's speed is its probe's, one value.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from tuner.core.errors import BadInputError, WorkloadError
from tuner.core.plan import Recommendation, recommend
from tuner.core.results import Profile, VariantValue
from tuner.engine.workload import Workload, load_workload, loaded_values, variant_options

# Below this M* the CLI explores variants on its own: a micro batch that small leaves
# most of a device idle, and a variant with less memory per sample may well train faster.
EXPLORE_BELOW = 4


@dataclass(frozen=True)
class VariantOutcome:
    """One variant: its options, its profile, its plan for ``B`` and that plan's speed by
    the profile's speed curve (``None`` where nothing fits or no ``B`` was given), with
    the spread of the timed rounds it rests on (a fraction; ``None`` without a curve)."""

    options: dict[str, VariantValue]
    profile: Profile
    recommendation: Recommendation | None
    samples_per_second: float | None
    spread: float | None = None

    @property
    def label(self) -> str:
        return describe_variant(self.options)


@dataclass(frozen=True)
class Exploration:
    """The variants measured, the one chosen, and why (:func:`choose`)."""

    variants: list[VariantOutcome]
    chosen: VariantOutcome | None
    reason: str = ""

    @property
    def group(self) -> str | None:
        return self.variants[0].profile.variant_group if self.variants else None


def describe_variant(options: dict[str, VariantValue]) -> str:
    """``{"checkpointing": True, "precision": "bf16"}`` reads ``checkpointing=true
    precision=bf16``, as ``-o`` takes it."""
    return " ".join(f"{name}={json.dumps(value).strip(chr(34))}" for name, value in options.items())


def should_explore(profile: Profile) -> bool:
    """Whether memory is short enough to explore on its own: ``M* < 4`` or nothing fits."""
    return profile.max_micro_batch_size < EXPLORE_BELOW


def variant_group(workload: Workload, device_key: str) -> str:
    """A key shared by one exploration's profiles: the target, the options held fixed,
    the device and the time it started."""
    seed = json.dumps(
        [workload.target, workload.options, device_key, datetime.now(UTC).isoformat()],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(seed.encode()).hexdigest()[:24]


Measure = Callable[[Workload], Profile]


def explore(
    workload: Workload,
    measure: Measure,
    *,
    global_batch_size: int | None,
    world_size: int = 1,
    done: Profile | None = None,
) -> Exploration:
    """Profile every variant of ``workload`` with ``measure`` (the same search each time)
    and choose. ``done`` is the profile of ``workload`` as loaded, when it was measured
    already. Variants are loaded from the workload's target with their options."""
    if workload.target is None:
        raise BadInputError(
            f"{workload.name} has no target: load it with load_workload('package.module:"
            "function') so that each variant can be loaded with its options"
        )
    combinations = variant_options(workload)
    loaded = loaded_values(workload, list(combinations[0]))
    group: str | None = None
    measured: list[tuple[dict[str, VariantValue], Workload, Profile, Recommendation | None]] = []
    for index, options in enumerate(combinations):
        variant = load_workload(workload.target, {**workload.options, **options})
        variant.parallel = workload.parallel
        reuse = done is not None and index == 0 and options == loaded
        result = done if reuse and done is not None else measure(variant)
        group = group or variant_group(workload, result.device_key)
        values = _json_values(options)
        profile = result.model_copy(update={"variant": values, "variant_group": group})
        measured.append((values, variant, profile, _plan(profile, global_batch_size, world_size)))
    outcomes = [
        VariantOutcome(
            values,
            profile,
            plan,
            plan.expected_samples_per_second if plan is not None else None,
            plan.expected_speed_spread if plan is not None else None,
        )
        for values, _, profile, plan in measured
    ]
    chosen, reason = choose(outcomes)
    return Exploration(outcomes, chosen, reason)


def choose(outcomes: list[VariantOutcome]) -> tuple[VariantOutcome | None, str]:
    """The variant to train, and why. The first outcome is the variant as loaded: it stays
    unless another is faster by more than the spread of the two, its plan's speed by its
    speed curve (without a global batch, by its probe at ``M*``); when it does not fit,
    the fastest that fits. ``None`` when no variant fits at all."""
    fitting = [o for o in outcomes if o.profile.max_micro_batch_size >= 1]
    fastest = max(fitting, key=_speed, default=None)
    if fastest is None:
        return None, "no variant fits"
    loaded = outcomes[0]
    if loaded not in fitting:
        return fastest, "the fastest of the variants that fit (the variant as loaded does not)"
    if fastest is loaded or _speed(loaded) <= 0:
        return loaded, "the fastest measured"
    gain = _speed(fastest) / _speed(loaded) - 1
    if loaded.spread is None or fastest.spread is None:
        return fastest, f"{gain:.0%} faster than as loaded (timed once: no spread to weigh)"
    noise = max(loaded.spread, fastest.spread)
    if gain > noise:
        return fastest, (
            f"{gain:.0%} faster than as loaded, more than the measured spread ({noise:.0%})"
        )
    return loaded, (
        f"as loaded: {fastest.label or 'another variant'} measured {gain:.0%} faster, within "
        f"the spread of the timed rounds ({noise:.0%}), which cannot tell them apart"
    )


def _speed(outcome: VariantOutcome) -> float:
    if outcome.samples_per_second is not None:
        return outcome.samples_per_second
    probe = outcome.profile.probe_at(outcome.profile.max_micro_batch_size)
    return (probe.samples_per_second if probe else None) or 0.0


def _plan(
    profile: Profile, global_batch_size: int | None, world_size: int
) -> Recommendation | None:
    if global_batch_size is None or profile.max_micro_batch_size < 1:
        return None
    return recommend(
        max_micro_batch_size=profile.max_micro_batch_size,
        probes=profile.probes,
        global_batch_size=global_batch_size,
        mesh=profile.parallel.mesh(world_size),
        capacity_bytes=profile.device.capacity_bytes,
        speeds=profile.speeds,
    )


def _json_values(options: dict[str, object]) -> dict[str, VariantValue]:
    values: dict[str, VariantValue] = {}
    for name, value in options.items():
        if not isinstance(value, str | int | float | bool) and value is not None:
            raise WorkloadError(
                f"variant option {name}={value!r} is not a string, number, boolean or null: "
                "declare variants with values that -o name=value can give"
            )
        values[name] = value
    return values
