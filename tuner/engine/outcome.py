"""From a finished search to a :class:`Profile`: what profiling in one process
(:mod:`tuner.engine.profiler`) and across W ranks (:mod:`tuner.engine.launch`, whose ranks
describe the workload with :func:`workload_info`) share: the defaults, the checks of the
search settings, the observer of each probe, and the profile itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from tuner.core.errors import BadInputError
from tuner.core.parallel import Parallel
from tuner.core.results import (
    AffineFit,
    DeviceInfo,
    ProbeResult,
    ProbeSettings,
    Profile,
    WorkloadInfo,
)
from tuner.engine.search import STRATEGIES, SearchOutcome
from tuner.engine.workload import Workload

DEFAULT_HEADROOM = 0.05
DEFAULT_SIZE_CAP = 4096


class ProbeObserver(Protocol):
    """Told about each probe as it starts and ends (the CLI's live display)."""

    def probe_started(self, micro_batch_size: int) -> None: ...

    def probe_finished(self, result: ProbeResult) -> None: ...


def observed(
    probe: Callable[[int], ProbeResult], observer: ProbeObserver | None
) -> Callable[[int], ProbeResult]:
    """``probe``, telling ``observer`` (when there is one) as each probe starts and ends."""
    if observer is None:
        return probe

    def observed_probe(size: int) -> ProbeResult:
        observer.probe_started(size)
        result = probe(size)
        observer.probe_finished(result)
        return result

    return observed_probe


def validate_search_settings(*, headroom: float, size_cap: int, strategy: str) -> None:
    if not 0 <= headroom < 1:
        raise BadInputError(
            f"headroom {headroom} is outside [0, 1): give the fraction of memory to keep free, "
            "e.g. 0.05"
        )
    if size_cap < 1:
        raise BadInputError(f"--max must be a positive micro batch size, got {size_cap}")
    if strategy not in STRATEGIES:
        raise BadInputError(f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")


def workload_info(workload: Workload, optimizer: torch.optim.Optimizer) -> WorkloadInfo:
    """What a person reads about the workload (FSDP's shards count whole); its sequence
    length when it was loaded with one (``-o seq_len=N``)."""
    seq_len = workload.options.get("seq_len")
    return WorkloadInfo(
        name=workload.name,
        target=workload.target,
        precision=workload.precision,
        activation_checkpointing=workload.activation_checkpointing,
        parameter_count=sum(p.numel() for p in workload.model.parameters()),
        optimizer=type(optimizer).__name__,
        seq_len=seq_len if type(seq_len) is int and seq_len >= 1 else None,
    )


def timeline_at_answer(probes: list[ProbeResult], answer: int) -> list[ProbeResult]:
    """``probes`` with only the timeline of the probe that answers (the last fitting probe
    at M*, the one the page shows) kept: the others' would only make the profile larger."""
    keep = next(
        (i for i in reversed(range(len(probes))) if probes[i].micro_batch_size == answer),
        None,
    )
    return [
        p if i == keep or p.timeline is None else p.model_copy(update={"timeline": None})
        for i, p in enumerate(probes)
    ]


def build_profile(
    *,
    keys: tuple[str, str],
    workload: WorkloadInfo,
    device: DeviceInfo,
    headroom: float,
    budget_bytes: int,
    strategy: str,
    size_cap: int,
    outcome: SearchOutcome,
    settings: ProbeSettings,
    wall_time_s: float,
    oversize: ProbeResult | None = None,
    world_size: int = 1,
    parallel: Parallel | None = None,
) -> Profile:
    """The profile of a finished search, in one process or across ranks."""
    measured = [(p.micro_batch_size, p.footprint_bytes) for p in outcome.probes]
    profile = Profile(
        workload_key=keys[0],
        device_key=keys[1],
        workload=workload,
        device=device,
        headroom=headroom,
        budget_bytes=budget_bytes,
        strategy=strategy,
        size_cap=size_cap,
        max_micro_batch_size=outcome.max_micro_batch_size,
        probes=timeline_at_answer(outcome.probes, outcome.max_micro_batch_size),
        oversize_probe=oversize,
        fit=AffineFit.through([(m, y) for m, y in measured if y is not None]),
        settings=settings,
        world_size=world_size,
        parallel=parallel or Parallel(),
        wall_time_s=wall_time_s,
    )
    problem = profile.unmeasured_answer()
    if problem is not None:  # the service would refuse it: a search that broke its contract
        raise RuntimeError(f"the search ended on an answer it did not measure: {problem}")
    return profile
