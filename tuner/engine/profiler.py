"""Profile a workload: probe it, search for ``M*``, and describe the outcome."""

from __future__ import annotations

import time

from tuner.core.errors import BadInputError
from tuner.core.results import OUTSIDE_BLOCKS, MemoryBreakdown, ProbeResult, ProbeSettings, Profile
from tuner.core.units import format_bytes
from tuner.engine.backends import Backend, storage_bytes
from tuner.engine.dry_run import DryRun
from tuner.engine.fingerprint import device_key, workload_key
from tuner.engine.launch import profile_distributed
from tuner.engine.outcome import (
    DEFAULT_HEADROOM,
    DEFAULT_SIZE_CAP,
    ProbeObserver,
    build_profile,
    observed,
    validate_search_settings,
    workload_info,
)
from tuner.engine.parallel import check_parallel
from tuner.engine.probe import Prober
from tuner.engine.search import Strategy, run_search
from tuner.engine.speeds import time_speeds as timed_speeds
from tuner.engine.workload import Workload, factory_options


def profile_workload(
    workload: Workload,
    backend: Backend,
    *,
    headroom: float = DEFAULT_HEADROOM,
    strategy: str = "model",
    size_cap: int = DEFAULT_SIZE_CAP,
    settings: ProbeSettings | None = None,
    observer: ProbeObserver | None = None,
    world_size: int = 1,
    search: Strategy | None = None,
    fake_world: bool = False,
    time_speeds: bool = True,
    per_rank_batch_size: int | None = None,
) -> Profile:
    """Find the largest micro batch of ``workload`` that fits ``backend`` with ``headroom``.

    ``search`` (called as a strategy is) replaces ``strategy``'s search in one process,
    e.g. one aimed by the same workload at other sequence lengths
    (:func:`tuner.engine.lengths.search_length`); distributed searches do not take one.

    The user's model, optimizer, RNG and train/eval flags are left as they were. When even
    one sample does not fit, the profile says so (``max_micro_batch_size == 0``) and, on a
    backend that can measure past its capacity, carries the full measurement at size 1 in
    ``oversize_probe``.

    A workload declared DDP or FSDP (``workload.parallel``) is measured on ``world_size``
    ranks, each a process of its own that loads the workload by its target
    (:func:`tuner.engine.launch.profile_distributed`); otherwise ``world_size`` is only what
    the plan divides the batch by, and the profile is one process's. With ``fake_world``
    this process stands for rank 0 of ``world_size`` on a fake process group instead
    (:mod:`tuner.engine.fake_world`): a world larger than the machine, measured.

    In one process, once ``M*`` is found, ``time_speeds`` times micro batches at a few
    sizes (:mod:`tuner.engine.speeds`; for the splits of ``per_rank_batch_size`` when
    given) and the profile keeps that speed curve: the answer compares splits by it.
    """
    validate_search_settings(headroom=headroom, size_cap=size_cap, strategy=strategy)
    if fake_world:
        from tuner.engine.fake_world import profile_fake_world

        return profile_fake_world(
            workload,
            backend,
            world_size=world_size,
            headroom=headroom,
            strategy=strategy,
            size_cap=size_cap,
            settings=settings,
            observer=observer,
        )
    if workload.parallel.distributed:
        check_parallel(workload, workload.parallel, world_size)
        if workload.target is None:
            raise BadInputError(
                f"{workload.name} is declared {workload.parallel.mode}: each rank loads it by "
                "its target, so load it with load_workload('package.module:function')"
            )
        return profile_distributed(
            workload.target,
            options=workload.options,
            device=str(backend.device) if backend.kind == "cuda" else "cpu",
            memory_limit_bytes=backend.memory_limit_bytes,
            world_size=world_size,
            parallel=workload.parallel,
            headroom=headroom,
            strategy=strategy,
            size_cap=size_cap,
            settings=settings,
            observer=observer,
        )
    started = time.perf_counter()
    with (
        backend.session(),
        Prober(
            workload, backend, headroom=headroom, settings=settings, locate=True, timeline=True
        ) as prober,
        DryRun(workload, backend, headroom=headroom) as dry_run,
    ):
        keys = (workload_key(workload, prober.optimizer), device_key(backend))

        observed_probe = observed(prober, observer)
        predict = dry_run if dry_run.available else None
        if search is not None:
            outcome = search(
                observed_probe, cap=size_cap, budget_bytes=prober.budget_bytes, predict=predict
            )
        else:
            outcome = run_search(
                strategy,
                observed_probe,
                cap=size_cap,
                budget_bytes=prober.budget_bytes,
                predict=predict,
            )
        oversize = None
        if outcome.max_micro_batch_size == 0 and outcome.probes[0].oom and backend.kind == "cpu":
            oversize = prober(1, enforce_capacity=False)
        info = workload_info(workload, prober.optimizer)
        speeds = None
        if time_speeds and outcome.max_micro_batch_size >= 1:
            speeds = timed_speeds(prober, outcome.max_micro_batch_size, per_rank_batch_size)
    profile = build_profile(
        keys=keys,
        workload=info,
        device=backend.describe(),
        headroom=headroom,
        budget_bytes=prober.budget_bytes,
        strategy=strategy,
        size_cap=size_cap,
        outcome=outcome,
        oversize=oversize,
        settings=prober.settings,
        wall_time_s=time.perf_counter() - started,
    )
    return profile.model_copy(update={"speeds": speeds})


def nothing_fits_advice(profile: Profile, workload: Workload) -> str:
    """Why even one sample does not fit, with the measured breakdown, and what would help."""
    probe = profile.oversize_probe or profile.probes[0]
    breakdown = probe.breakdown
    lines = [
        f"Even a micro batch of 1 does not fit in {format_bytes(profile.budget_bytes)} "
        f"({1 - profile.headroom:.0%} of {format_bytes(profile.device.capacity_bytes)})."
    ]
    if breakdown is not None and probe.footprint_bytes is not None:
        lines.append(
            f"Measured at micro batch 1: {format_bytes(probe.footprint_bytes)} in all, "
            + _breakdown_text(breakdown)
            + "."
        )
    else:
        params = storage_bytes(workload.model.parameters())
        grads = storage_bytes(p for p in workload.model.parameters() if p.requires_grad)
        lines.append(
            f"The step ran out of memory before finishing; parameters alone take "
            f"{format_bytes(params)} and their gradients {format_bytes(grads)}."
        )
    lines.extend(f"Where the peak is: {line}." for line in peak_advice(probe, workload))
    lines.append("What would help: " + "; ".join(_remedies(workload, breakdown)) + ".")
    return "\n".join(lines)


def _breakdown_text(breakdown: MemoryBreakdown) -> str:
    parts = [
        ("parameters", breakdown.parameters_bytes),
        ("gradients", breakdown.gradients_bytes),
        ("optimizer state", breakdown.optimizer_state_bytes),
        ("activations and temporaries", breakdown.activations_bytes),
    ]
    return ", ".join(f"{name} {format_bytes(size)}" for name, size in parts)


def peak_advice(probe: ProbeResult, workload: Workload) -> list[str]:
    """What the location of ``probe``'s peak says would let a larger micro batch fit: a
    lighter optimizer when the optimizer step is the peak, else checkpointing the blocks
    that hold most of the saved activations (or a lighter loss when the loss does)."""
    breakdown = probe.breakdown
    if breakdown is None or breakdown.peak_phase is None:
        return []
    if breakdown.peak_phase == "optimizer":
        return [
            f"the peak ({format_bytes(probe.peak_allocated_bytes)}) falls in the optimizer "
            f"step, not in forward or backward: a lighter optimizer lowers it (its state is "
            f"{format_bytes(breakdown.optimizer_state_bytes)}; SGD keeps none, foreach=False "
            f"avoids a step's temporary copies{_optimizer_option(workload)}); checkpointing "
            "would not"
        ]
    heaviest = heaviest_blocks(breakdown.activations_by_block_bytes)
    if not heaviest:
        return []
    names = ", ".join(heaviest)
    held = sum(breakdown.activations_by_block_bytes[name] for name in heaviest)
    total = sum(breakdown.activations_by_block_bytes.values())
    verb = "holds" if len(heaviest) == 1 else "hold"
    where = f"the peak falls in {breakdown.peak_phase}; {names} {verb} {format_bytes(held)} " + (
        f"of the {format_bytes(total)} saved for backward at micro batch {probe.micro_batch_size}"
    )
    if heaviest == [OUTSIDE_BLOCKS]:
        return [
            f"{where}: the loss and the code between blocks save most (a chunked loss, or "
            "logits kept in a lower precision, would lower it)"
        ]
    blocks = [name for name in heaviest if name != OUTSIDE_BLOCKS]
    if workload.activation_checkpointing:
        return [f"{where} (checkpointing is on)"]
    return [
        f"{where}: activation checkpointing of {', '.join(blocks)} would keep only "
        f"{'its input' if len(blocks) == 1 else 'their inputs'} and recompute the rest in "
        "backward"
    ]


def _optimizer_option(workload: Workload) -> str:
    """How to choose another optimizer, when the workload's factory takes one."""
    if "optimizer" not in factory_options(workload):
        return ""
    return f"; {workload.target} takes -o optimizer=..."


def heaviest_blocks(by_block: dict[str, int], *, share: float = 0.5) -> list[str]:
    """The fewest blocks, heaviest first, that hold at least ``share`` of the saved bytes
    (blocks of equal weight go together: four equal transformer blocks are named as four)."""
    total = sum(by_block.values())
    if total <= 0:
        return []
    ordered = sorted(by_block.items(), key=lambda item: item[1], reverse=True)
    chosen: list[str] = []
    held = 0
    for name, size in ordered:
        if held >= share * total and size < by_block[chosen[-1]]:
            break
        chosen.append(name)
        held += size
    return chosen


def _remedies(workload: Workload, breakdown: MemoryBreakdown | None) -> list[str]:
    remedies = []
    if not workload.activation_checkpointing:
        remedies.append("activation checkpointing (recompute activations in backward)")
    if workload.precision == "fp32":
        remedies.append("bf16 autocast (halves activations)")
    if breakdown is None or breakdown.optimizer_state_bytes > 0:
        remedies.append(
            "a lighter optimizer (SGD without momentum keeps no state; AdamW keeps two copies "
            f"of the weights{_optimizer_option(workload)})"
        )
    remedies.append("a device with more memory, or sharding the model across devices")
    return remedies
