"""Profiling at world size W: W rank processes, one search, every rank probing each size.

This process runs the search and coordinates; each rank (a process of its own, gloo on
the loopback address for the CPU, NCCL with one GPU per rank for CUDA) loads the workload
by its target, wraps it the way it trains (:mod:`tuner.engine.parallel`) and probes the
size it is sent. A probe's peak is the largest over ranks, and a size fits only when it
fits on every rank.

Why a coordinator rather than an all-reduce among the ranks: a rank that runs out of
memory inside a collective-bearing step (DDP's all-reduce in the last backward, FSDP's
all-gather in every forward) leaves the other ranks waiting inside that collective, where
no agreement among them can reach them. So each rank reports to this process, which
decides. A size is "does not fit" when any rank ran out of memory; the ranks are then
ended and started afresh (a process group with a half-finished collective is unusable),
so no rank ever waits for one that left, and every probe is bounded by ``probe_timeout_s``.
On the CPU the ranks never stop at the limit: each runs the whole step with its memory
counted and compares its peak with the limit afterwards (the same verdict, no collective
left half done), which is also how an uneven rank is seen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import multiprocessing
import multiprocessing.connection
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.core.errors import BadInputError, RankFailedError
from tuner.core.parallel import Parallel
from tuner.core.results import DeviceInfo, ProbeResult, ProbeSettings, Profile, WorkloadInfo
from tuner.core.units import format_bytes
from tuner.engine.dry_run import dry_run_of_target
from tuner.engine.outcome import (
    ProbeObserver,
    build_profile,
    observed,
    validate_search_settings,
)
from tuner.engine.rank import (
    PROBE_TIMEOUT_S,
    RankReady,
    RankRequest,
    rank_environment,
    rank_main,
)
from tuner.engine.search import run_search

READY_TIMEOUT_S = 600.0

# What a rank imports before it can start: the fork server loads it once, and each rank
# starts as a fork of it, in a tenth of a second instead of the seconds a new interpreter
# spends importing torch (and transformers). The ranks start afresh after every probe
# that runs out of memory, so a search would otherwise pay those seconds at every start.
RANK_PRELOAD = (
    "torch",
    "torch.distributed",
    # An optimizer's first construction imports dynamo (torch._compile's lazy import):
    # measured, most of a rank's start after torch itself.
    "torch._dynamo",
    "tuner.engine.rank",
    "tuner.engine.backends",
    "tuner.engine.probe",
    "tuner.engine.workload",
    "tuner.engine.parallel",
)


def rank_context(
    target: str,
) -> multiprocessing.context.ForkServerContext | multiprocessing.context.SpawnContext:
    """How rank processes start: forked from a fork server that has imported what a rank
    needs (it starts once per process, with the environment of that moment; each rank
    then takes the environment of its own start from its request), or spawned where
    there is no fork server. The server imports nothing of the user's: an import with
    side effects runs in each rank, as before."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    # The project's transformers models: the library is most of a rank's start.
    hf = ("tuner.hf",) if target.split(":")[0].startswith("tuner.hf") else ()
    context.set_forkserver_preload([*RANK_PRELOAD, *hf])
    return context


def check_world_size(device: str, world_size: int, memory_limit_bytes: int | None) -> None:
    """Refuse a world size this machine cannot run, before any rank starts."""
    if world_size < 1:
        raise BadInputError(f"--world-size must be at least 1, got {world_size}")
    if device.startswith("cuda"):
        import torch

        visible = torch.cuda.device_count()
        if world_size > visible:
            raise BadInputError(
                f"--world-size {world_size} needs one GPU per rank and {visible} are visible; "
                "profile at most that many here, or launch each node's ranks with torchrun"
            )
        return
    available = _available_memory_bytes()
    if memory_limit_bytes is not None and available and world_size * memory_limit_bytes > available:
        raise BadInputError(
            f"--world-size {world_size} × --memory-limit {format_bytes(memory_limit_bytes)} "
            f"is more than this machine's {format_bytes(available)} of free memory; use fewer "
            "ranks or a smaller limit"
        )


def _available_memory_bytes() -> int:
    """Memory a new process can have without swapping (Linux's MemAvailable counts the
    page cache that can be dropped); 0 when unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


@dataclass
class RankGroup:
    """W rank processes and a pipe to each. Started afresh after a failed probe."""

    request: RankRequest
    processes: list[multiprocessing.process.BaseProcess] = field(default_factory=list)
    pipes: list[multiprocessing.connection.Connection] = field(default_factory=list)

    def start(self) -> RankReady:
        """Start every rank and wait until each is set up."""
        self.spawn()
        return self.wait_ready()

    def spawn(self) -> None:
        """Start every rank's process, without waiting for it (:meth:`wait_ready`)."""
        context = rank_context(self.request.target)
        with rank_environment(self.request.device):
            request = dataclasses.replace(
                self.request, port=_free_port(), environment=dict(os.environ)
            )
            for rank in range(request.world_size):
                ours, theirs = context.Pipe()
                process = context.Process(
                    target=rank_main, args=(rank, request, theirs), name=f"tuner-rank-{rank}"
                )
                process.start()
                theirs.close()
                self.processes.append(process)
                self.pipes.append(ours)

    def wait_ready(self) -> RankReady:
        """Rank 0's description of the run, once every rank is set up."""
        answers = self._collect(READY_TIMEOUT_S, what="start")
        ready = answers[0][1] if answers else None
        if not isinstance(ready, RankReady):
            raise RankFailedError(f"rank 0 did not describe the run: {ready!r}")
        return ready

    def probe(self, size: int, timeout_s: float) -> list[ProbeResult] | None:
        """Every rank's result at ``size``; ``None`` when a rank ran out of memory and the
        group had to be ended (the caller restarts it)."""
        for pipe in self.pipes:
            pipe.send(("probe", size))
        answers = self._collect(timeout_s, what=f"probe {size}", stop_on_oom=True)
        if answers is None:
            return None
        return [ProbeResult.model_validate(payload) for _, payload in answers]

    def _collect(
        self, timeout_s: float, *, what: str, stop_on_oom: bool = False
    ) -> list[tuple[str, Any]] | None:
        deadline = time.monotonic() + timeout_s
        answers: dict[int, tuple[str, Any]] = {}
        while len(answers) < len(self.pipes):
            waiting = [p for i, p in enumerate(self.pipes) if i not in answers]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.stop()
                raise RankFailedError(
                    f"ranks {sorted(set(range(len(self.pipes))) - set(answers))} did not answer "
                    f"({what}) within {timeout_s:.0f} s; they were ended"
                )
            ranks = {id(pipe): rank for rank, pipe in enumerate(self.pipes)}
            for ready in multiprocessing.connection.wait(waiting, timeout=min(remaining, 1.0)):
                rank = ranks[id(ready)]
                kind: str
                payload: Any
                try:
                    kind, payload = self.pipes[rank].recv()
                except EOFError:
                    kind, payload = "died", None
                if kind in ("error", "bad_input", "died"):
                    self.processes[rank].join(timeout=1.0)  # its exit status, when it died
                    code = self.processes[rank].exitcode
                    self.stop()
                    if kind == "bad_input":
                        raise BadInputError(str(payload))
                    raise RankFailedError(
                        f"rank {rank} failed ({what}): "
                        + (
                            str(payload)
                            if payload
                            else f"it exited with status {code}{_hint(what)}"
                        )
                    )
                answers[rank] = (kind, payload)
                if stop_on_oom and kind == "result" and payload.get("oom"):
                    # The others may be waiting inside a collective this rank left: end them
                    # at once, there is nothing to wait for.
                    self.stop(grace_s=0.0)
                    return None
            self._check_alive(answers, what)
        return [answers[rank] for rank in range(len(self.pipes))]

    def _check_alive(self, answers: dict[int, tuple[str, Any]], what: str) -> None:
        for rank, process in enumerate(self.processes):
            if rank not in answers and not process.is_alive() and not self.pipes[rank].poll():
                code = process.exitcode
                self.stop()
                raise RankFailedError(
                    f"rank {rank} exited with status {code} before answering ({what}){_hint(what)}"
                )

    def stop(self, grace_s: float = 5.0) -> None:
        """Ask every rank to leave, then end those still there after ``grace_s``."""
        for pipe in self.pipes:
            with contextlib.suppress(OSError, ValueError):  # a rank that has already gone
                pipe.send(("stop", 0))
        deadline = time.monotonic() + grace_s
        for process in self.processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                process.kill()
                process.join()
        for pipe in self.pipes:
            pipe.close()
        self.processes, self.pipes = [], []


def _hint(what: str) -> str:
    if what != "start":
        return ""
    # The usual cause: each rank is a fresh interpreter that imports the caller's script.
    return (
        "; if you called this from a script, put the call under "
        "`if __name__ == '__main__':` (each rank is a new Python process importing it)"
    )


def combine(size: int, results: list[ProbeResult], settings: ProbeSettings) -> ProbeResult:
    """One probe from every rank's: peaks are the largest over ranks, it fits only when it
    fits on every rank, the breakdown is that of the rank with the largest peak (with the
    largest collective copies of any rank), and the
    step time is the slowest rank's (the step ends when the last rank's does)."""
    peaks = [r.peak_reserved_bytes or 0 for r in results]
    worst = results[max(range(len(results)), key=lambda i: peaks[i])]
    phases: dict[str, int] = {}
    for result in results:
        for phase, value in result.phase_peaks_bytes.items():
            phases[phase] = max(phases.get(phase, 0), value)
    step_times = [r.step_time_s for r in results if r.step_time_s is not None]
    step_time = max(step_times) if len(step_times) == len(results) else None
    samples = size * settings.microbatches_per_step
    # Gloo's copies: the most any rank held beyond its peak (the limit holds on every rank).
    copies = max(r.collective_copies_bytes for r in results)
    return ProbeResult(
        micro_batch_size=size,
        fits=all(r.fits for r in results),
        oom=any(r.oom for r in results),
        peak_allocated_bytes=max((r.peak_allocated_bytes or 0 for r in results), default=None),
        peak_reserved_bytes=max(peaks),
        non_torch_bytes=max(r.non_torch_bytes for r in results),
        alloc_retries=max(r.alloc_retries for r in results),
        phase_peaks_bytes=phases,
        breakdown=(
            worst.breakdown.model_copy(update={"collective_copies_bytes": copies})
            if worst.breakdown is not None
            else None
        ),
        rank_peaks_bytes=peaks,
        rank_breakdowns=[r.breakdown for r in results if r.breakdown is not None],
        step_time_s=step_time,
        samples_per_second=samples / step_time if step_time else None,
        steps_run=max(r.steps_run for r in results),
        wall_time_s=max(r.wall_time_s for r in results),
        error=next((r.error for r in results if r.error), None),
    )


def out_of_memory_on_a_rank(size: int, wall_time_s: float) -> ProbeResult:
    return ProbeResult(
        micro_batch_size=size,
        fits=False,
        oom=True,
        wall_time_s=wall_time_s,
        error="out of memory on at least one rank; every rank counts it as does not fit",
    )


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _capacity_of_budget(budget_bytes: int, headroom: float) -> int:
    """The device capacity a rank's budget, ``⌊(1 − headroom) × capacity⌋``, stands for."""
    return math.ceil(budget_bytes / (1 - headroom))


def _cpu_capacity_bytes(device: str, memory_limit_bytes: int | None, headroom: float) -> int | None:
    """The capacity the dry run is given, before any rank has said its budget: on the CPU
    a rank's capacity is the limit, and this is the same arithmetic through its budget
    (so the predictions are those made after the ranks answered, to the byte); ``None``
    on a GPU, whose capacity only a rank can read."""
    if device.startswith("cuda") or memory_limit_bytes is None:
        return None
    return _capacity_of_budget(int((1 - headroom) * memory_limit_bytes), headroom)


def profile_distributed(
    target: str,
    *,
    options: Mapping[str, Any] | None = None,
    device: str,
    memory_limit_bytes: int | None,
    world_size: int,
    parallel: Parallel,
    headroom: float,
    strategy: str,
    size_cap: int,
    settings: ProbeSettings | None = None,
    observer: ProbeObserver | None = None,
    probe_timeout_s: float = PROBE_TIMEOUT_S,
) -> Profile:
    """Find the largest micro batch that fits on every one of ``world_size`` ranks.

    The workload is loaded by ``target`` in each rank (a process cannot receive another's
    model), wrapped for ``parallel`` and probed at the sizes one search picks.
    """
    validate_search_settings(headroom=headroom, size_cap=size_cap, strategy=strategy)
    check_world_size(device, world_size, memory_limit_bytes)
    settings = settings or ProbeSettings()
    started = time.perf_counter()
    group = RankGroup(
        RankRequest(
            target=target,
            options=dict(options or {}),
            device=device,
            memory_limit_bytes=memory_limit_bytes,
            world_size=world_size,
            parallel=parallel,
            headroom=headroom,
            settings=settings,
            port=0,
        )
    )
    # FSDP's ranks are predicted as a fake world's rank 0 is, and the search starts at the
    # predictions' M*; DDP's reducer does not run on fake tensors, so its ranks are aimed
    # by one process's step calibrated on their probe of size 1.
    of_a_rank = parallel.mode == "fsdp"
    group.spawn()
    try:
        # On the CPU the coordinator's dry run is built while the ranks start (each
        # imports torch and builds its model): its capacity is known without them.
        early = _cpu_capacity_bytes(device, memory_limit_bytes, headroom)
        dry_run = (
            dry_run_of_target(
                target,
                options or {},
                capacity_bytes=early,
                headroom=headroom,
                ranks=(parallel, world_size) if of_a_rank else None,
            )
            if early is not None
            else None
        )
        ready = group.wait_ready()
    except BaseException:
        group.stop(grace_s=0.0)
        raise

    def on_every_rank(size: int) -> ProbeResult:
        probe_started = time.perf_counter()
        if not group.processes:
            group.start()
        results = group.probe(size, probe_timeout_s)
        return (
            out_of_memory_on_a_rank(size, time.perf_counter() - probe_started)
            if results is None
            else combine(size, results, settings)
        )

    probe = observed(on_every_rank, observer)

    if dry_run is None:
        dry_run = dry_run_of_target(
            target,
            options or {},
            capacity_bytes=_capacity_of_budget(ready.budget_bytes, headroom),
            headroom=headroom,
            ranks=(parallel, world_size) if of_a_rank else None,
        )
    try:
        with dry_run:
            outcome = run_search(
                strategy,
                probe,
                cap=size_cap,
                budget_bytes=ready.budget_bytes,
                predict=dry_run if dry_run.available else None,
                aim_first=of_a_rank,  # else calibrated on the ranks' probes first
            )
    finally:
        group.stop()
    return build_profile(
        keys=(ready.workload_key, ready.device_key),
        workload=WorkloadInfo.model_validate(ready.workload_info),
        device=DeviceInfo.model_validate(ready.device_info),
        headroom=headroom,
        budget_bytes=ready.budget_bytes,
        strategy=strategy,
        size_cap=size_cap,
        outcome=outcome,
        settings=settings,
        world_size=world_size,
        parallel=parallel,
        wall_time_s=time.perf_counter() - started,
    )
