"""One rank of a profile at world size W: set up, then probe the sizes it is sent.

Runs in a process of its own (started by :mod:`tuner.engine.launch`). It joins the
process group, loads the workload by target, moves it to its device, wraps it for the
declared parallel mode and answers each ``("probe", size)`` with its own
:class:`ProbeResult`, until ``("stop", 0)`` or the pipe closes. What it receives
(:class:`RankRequest`) and sends (:class:`RankReady`, :func:`rank_error`) is defined here,
beside the code that reads and writes it; the coordinator imports it.
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection
import os
import sys
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NoReturn

from tuner.core.errors import BadInputError, WorkloadError
from tuner.core.parallel import Parallel
from tuner.core.results import ProbeSettings

# The longest a probe may take: the coordinator waits this long for every rank (by default).
PROBE_TIMEOUT_S = 1800.0


# A CPU rank where the exact count cannot be built counts every thread's allocations with
# torch.profiler (see backends/allocations.py), whose C++ side talks on stderr: kineto's
# USDT and stage lines at every start and stop, and c10's warning that a block allocated
# before profiling was freed during it. They say nothing about the workload, so a CPU rank
# starts with them off: c10 warnings below ERROR (read once, when torch loads) and every
# kineto level (6 is past its highest, USDT). A value the user set stays.
QUIET_CPU_RANK_ENVIRONMENT = {"TORCH_CPP_LOG_LEVEL": "ERROR", "KINETO_LOG_LEVEL": "6"}


@contextlib.contextmanager
def rank_environment(device: str) -> Iterator[None]:
    """Around starting rank processes (which inherit this process's environment): the
    environment a rank on ``device`` needs, put back as it was afterwards."""
    added = {}
    if not device.startswith("cuda"):
        added = {k: v for k, v in QUIET_CPU_RANK_ENVIRONMENT.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def rank_error(exc: BaseException) -> tuple[str, str]:
    """What a rank sends back for an exception that is not an out-of-memory."""
    if isinstance(exc, BadInputError | WorkloadError):
        return "bad_input", exc.message
    return "error", "".join(traceback.format_exception(exc)).rstrip()


# Collectives give up after this long, so a rank is never stuck for ever, even when the
# coordinator is killed before it can end the ranks.
PROCESS_GROUP_TIMEOUT = timedelta(seconds=PROBE_TIMEOUT_S)


@dataclass(frozen=True)
class RankRequest:
    """What every rank needs to set itself up: picklable, so it crosses ``spawn``."""

    target: str
    options: Mapping[str, Any]
    device: str
    memory_limit_bytes: int | None
    world_size: int
    parallel: Parallel
    headroom: float
    settings: ProbeSettings
    port: int
    # The coordinator's environment when the ranks start: a rank forked from the fork
    # server (see launch.rank_context) would otherwise have the server's, from its start.
    environment: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RankReady:
    """Rank 0's description of the run, sent once it is set up."""

    workload_key: str
    device_key: str
    workload_info: dict[str, Any]
    device_info: dict[str, Any]
    budget_bytes: int


def rank_main(rank: int, request: RankRequest, conn: multiprocessing.connection.Connection) -> None:
    if request.environment:
        os.environ.clear()
        os.environ.update(request.environment)
    import torch
    import torch.distributed as dist

    # Ranks share the machine's cores; more threads than cores per rank only contend.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // request.world_size))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(request.port))
    cuda = request.device.startswith("cuda")
    try:
        if cuda:
            torch.cuda.set_device(rank)
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            rank=rank,
            world_size=request.world_size,
            timeout=PROCESS_GROUP_TIMEOUT,
        )
        try:
            _serve(rank, request, conn)
        finally:
            dist.destroy_process_group()
    except Exception as exc:
        _send(conn, rank_error(exc))
    finally:
        conn.close()
    _leave()


def _leave() -> NoReturn:
    """End the rank's process now that it has answered and left the process group.

    The interpreter's own teardown of a process that loaded torch spends seconds (measured:
    2.8 s for a gloo rank on a busy 2-core machine, 4 s with a model loaded) collecting
    torch's objects, and the coordinator waits for every rank to leave before it answers;
    nothing of a rank's needs that teardown (its results went through the pipe)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _serve(rank: int, request: RankRequest, conn: multiprocessing.connection.Connection) -> None:
    from tuner.engine.backends import make_backend
    from tuner.engine.fingerprint import device_key, workload_key
    from tuner.engine.outcome import workload_info
    from tuner.engine.probe import Prober
    from tuner.engine.workload import load_workload

    device = f"cuda:{rank}" if request.device.startswith("cuda") else "cpu"
    # Gloo's worker threads allocate for the collectives: on the CPU the limit holds them too.
    # Made before the workload is loaded: the CPU's count of every allocation is installed
    # here, and must see the model's and the optimizer's tensors allocated to see them freed.
    backend = make_backend(
        device, memory_limit_bytes=request.memory_limit_bytes, count_all_threads=True
    )
    workload = load_workload(request.target, dict(request.options))
    workload.parallel = request.parallel
    with (
        backend.session(),
        Prober(
            workload,
            backend,
            headroom=request.headroom,
            settings=request.settings,
            rank=rank,
        ) as prober,
    ):
        ready: Any = "ready"
        if rank == 0:
            ready = RankReady(
                workload_key=workload_key(workload, prober.optimizer),
                device_key=device_key(backend),
                workload_info=workload_info(workload, prober.optimizer).model_dump(mode="json"),
                device_info=backend.describe().model_dump(mode="json"),
                budget_bytes=prober.budget_bytes,
            )
        conn.send(("ready", ready))
        while True:
            try:
                kind, size = conn.recv()
            except EOFError:
                return
            if kind != "probe":
                return
            result = prober(size)
            conn.send(("result", result.model_dump(mode="json")))


def _send(conn: multiprocessing.connection.Connection, message: tuple[str, str]) -> None:
    # When the coordinator is gone nothing is waiting for this rank's answer.
    with contextlib.suppress(OSError, ValueError):
        conn.send(message)
