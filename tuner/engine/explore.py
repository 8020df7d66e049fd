"""The memory/speed trade-off, measured: profile each variant a workload declares
(activation checkpointing, precision, ...) and pick the fastest that keeps ``B`` exact.

Each variant gets the same search and a profile of its own; the profiles share a
``variant_group``. For a global batch ``B`` each variant's plan (``tuner.core.plan``'s
default policy) is then run as training runs it, a timed optimizer step over its split,
and the variant with the highest measured samples per second wins::

    samples/s = (B / W) / seconds per optimizer step        (per rank)
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
from tuner.engine.backends import Backend
from tuner.engine.probe import Prober
from tuner.engine.workload import Workload, load_workload, loaded_values, variant_options

# Below this M* the CLI explores variants on its own: a micro batch that small leaves
# most of a device idle, and a variant with less memory per sample may well train faster.
EXPLORE_BELOW = 4
# Rounds of timed steps per variant (each a warm-up step and a timed one).
TIMING_ROUNDS = 2


@dataclass(frozen=True)
class VariantOutcome:
    """One variant: its options, its profile, its plan for ``B`` and the measured speed
    of that plan (``None`` where nothing fits or no ``B`` was given)."""

    options: dict[str, VariantValue]
    profile: Profile
    recommendation: Recommendation | None
    samples_per_second: float | None

    @property
    def label(self) -> str:
        return describe_variant(self.options)


@dataclass(frozen=True)
class Exploration:
    variants: list[VariantOutcome]
    chosen: VariantOutcome | None

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
    backend: Backend,
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
    speeds = _timed_speeds(backend, [(w, p, plan) for _, w, p, plan in measured])
    outcomes = [
        VariantOutcome(values, profile, plan, speed)
        for (values, _, profile, plan), speed in zip(measured, speeds, strict=True)
    ]
    return Exploration(outcomes, choose(outcomes))


def choose(outcomes: list[VariantOutcome]) -> VariantOutcome | None:
    """The variant with the highest measured samples per second; without a global batch,
    the highest measured at its own ``M*``. ``None`` when no variant fits at all."""
    fitting = [o for o in outcomes if o.profile.max_micro_batch_size >= 1]

    def speed(outcome: VariantOutcome) -> float:
        if outcome.samples_per_second is not None:
            return outcome.samples_per_second
        probe = outcome.profile.probe_at(outcome.profile.max_micro_batch_size)
        return (probe.samples_per_second if probe else None) or 0.0

    return max(fitting, key=speed, default=None)


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
    )


def _timed_speeds(
    backend: Backend, plans: list[tuple[Workload, Profile, Recommendation | None]]
) -> list[float | None]:
    """Samples per second of each plan, timed in interleaved rounds and the fastest round
    kept: a busy host slows whichever variant runs during the busy spell, and one round
    alone would crown the variant that ran in a quiet one."""
    best: list[float | None] = [None] * len(plans)
    for _ in range(TIMING_ROUNDS):
        for index, (workload, profile, plan) in enumerate(plans):
            if plan is None:
                continue
            if workload.parallel.distributed:
                # A timed step under DDP or FSDP needs every rank: the profile's speed stands.
                best[index] = plan.expected_samples_per_second
                continue
            with backend.session(), Prober(workload, backend, headroom=profile.headroom) as prober:
                speed = plan.per_rank_batch_size / prober.time_split(plan.split, steps=1)
            best[index] = max(speed, best[index] or 0.0)
    return best


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
