"""A world larger than the machine: one process stands for one rank of W.

Torch's fake process group (``torch.testing._internal.distributed.fake_pg``) answers
every collective at once with tensors of the right shapes and moves no data. A rank's
step then allocates what it allocates on a real world of W ranks — its parameter,
gradient and optimizer shards, FSDP's all-gather and reduce-scatter buffers, the tensor
plan's activations — on real tensors counted by the real tracker, so a mesh of 64 × 8 is
measured on one device, not estimated. The numbers it trains on are not a real
training's (nothing was exchanged), and the profile says so.

That holds only while memory does not depend on the values a collective returns. A step
that routes tokens by the result of an all-reduce, or sizes a tensor by a count it
received, would allocate for made-up values; such a workload is refused: the first probe
runs under :class:`CollectiveValueGuard`, which marks every storage computed from a
collective's output and refuses the first operator whose result's shape or Python value
is read from a marked one (``nonzero``, ``.item()``, ``unique``, ...).

Rank 0 is the one measured: torch's sharding gives the lowest ranks the largest shards
when a dimension does not split evenly.

The search is aimed as one process's is (:mod:`tuner.engine.dry_run`): a fake copy of the
model, sharded and split as this rank's, runs the same step on fake tensors in the same
fake world (DTensors and FSDP's collectives run on fake tensors as on real ones), and the
search starts at the predictions' ``M*``. They differ from the probes by a constant, the
biases of the tensor-parallel layers (768 B a block of ``examples.mesh_mlp`` at tp 8):
the README's 512-rank example takes 2 probes where it took 14.

A collective in a fake world is over the moment it is called; a real one is not, and
keeps its tensors alive until it completes (gloo's work objects on the CPU, NCCL's
stream-recorded blocks on a GPU). Measured against 4 real gloo ranks (examples.mesh_mlp,
1 × 4, 9 probes on each rank): the step peaks were equal to the byte in 34 of 36, and two
ranks held one collective's buffer more (392,640 B and 3,309,568 B: one activation all-
reduced, micro batch × sequence × width fp32). So each fake-world probe also records the
largest buffer any collective of its step moved (:class:`LargestCollective`) and counts it
in the footprint, as ``collective_copies_bytes``: one collective held a moment longer at
the peak. The peak itself (``peak_bytes``) stays what the step held.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tuner.core.errors import BadInputError, WorkloadError
from tuner.core.results import ProbeResult, ProbeSettings, Profile
from tuner.engine.backends import Backend
from tuner.engine.backends.base import plain_tensors
from tuner.engine.dry_run import DryRun
from tuner.engine.fake_group import (
    COLLECTIVE_NAMESPACES,
    fake_process_group,
    with_one_collective_in_flight,
)
from tuner.engine.fingerprint import device_key, workload_key
from tuner.engine.outcome import (
    ProbeObserver,
    build_profile,
    observed,
    validate_search_settings,
    workload_info,
)
from tuner.engine.parallel import check_parallel
from tuner.engine.probe import Prober
from tuner.engine.search import run_search
from tuner.engine.workload import Workload

# Operators whose output's shape, or whose Python result, depends on the input's values.
_VALUE_READS = frozenset(
    {
        "_local_scalar_dense",
        "item",
        "is_nonzero",
        "equal",
        "nonzero",
        "nonzero_static",
        "masked_select",
        "unique",
        "_unique",
        "_unique2",
        "unique_consecutive",
        "unique_dim",
        "bincount",
        "repeat_interleave",
        "histc",
    }
)
# Indexing whose result's shape is the number of true values of a boolean index.
_MASKED_INDEXING = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})


class CollectiveValueGuard(TorchDispatchMode):
    """Refuses a step whose shapes or control flow read values a collective produced."""

    def __init__(self) -> None:
        super().__init__()
        self._marked: dict[int, weakref.ref[Any]] = {}

    def _storages(self, values: Any) -> Iterator[Any]:
        for leaf in tree_leaves(values):
            if isinstance(leaf, torch.Tensor):
                for plain in plain_tensors(leaf):
                    yield plain.untyped_storage()

    def _mark(self, values: Any) -> None:
        for storage in self._storages(values):
            key = id(storage)
            if key not in self._marked:
                self._marked[key] = weakref.ref(storage, self._forgetter(key))

    def _forgetter(self, key: int) -> Callable[[object], None]:
        def forget(_ref: object) -> None:
            self._marked.pop(key, None)

        return forget

    def _reads_marked(self, values: Any) -> bool:
        return any(id(storage) in self._marked for storage in self._storages(values))

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        namespace = func.namespace
        name = func._opname
        if namespace in COLLECTIVE_NAMESPACES:
            out = func(*args, **kwargs)
            # In-place collectives (c10d's) write into their arguments; functional ones
            # return new tensors.
            self._mark((args, kwargs, out))
            return out
        marked = self._reads_marked((args, kwargs))
        if marked and (
            name in _VALUE_READS or (name in _MASKED_INDEXING and _masked_by_marked(self, args))
        ):
            raise WorkloadError(
                f"the step reads the values of a collective's result ({namespace}::{name}): "
                "its memory depends on the data the ranks exchange, which a fake world does "
                "not move; profile it on real ranks (leave out --fake-world)"
            )
        out = func(*args, **kwargs)
        if marked:
            self._mark(out)
        return out


def guarded_until_a_step_runs(probe: Callable[[int], ProbeResult]) -> Callable[[int], ProbeResult]:
    """``probe`` run under :class:`CollectiveValueGuard` until one probe has run its steps
    whole: a workload whose memory follows the values exchanged is refused at its first
    probe (the search's, size 1 for the model search), and no probe is run twice for it.
    A probe that runs out of memory may stop before the step reads a value, so the next
    one is guarded too. The guard allocates nothing: the guarded probe's peaks are those
    of an unguarded one."""
    checked = False

    def guarded(size: int) -> ProbeResult:
        nonlocal checked
        if checked:
            return probe(size)
        with CollectiveValueGuard():
            result = probe(size)
        checked = not result.oom
        return result

    return guarded


def _masked_by_marked(guard: CollectiveValueGuard, args: tuple[Any, ...]) -> bool:
    """Whether a boolean index computed from a collective's values selects the elements."""
    indices = args[1] if len(args) > 1 else ()
    return any(
        isinstance(index, torch.Tensor)
        and index.dtype in (torch.bool, torch.uint8)
        and guard._reads_marked(index)
        for index in indices or ()
    )


def profile_fake_world(
    workload: Workload,
    backend: Backend,
    *,
    world_size: int,
    headroom: float,
    strategy: str,
    size_cap: int,
    settings: ProbeSettings | None = None,
    observer: ProbeObserver | None = None,
) -> Profile:
    """Profile rank 0 of ``world_size`` ranks of ``workload.parallel`` in this process."""
    validate_search_settings(headroom=headroom, size_cap=size_cap, strategy=strategy)
    if not workload.parallel.distributed:
        raise BadInputError("--fake-world needs --parallel ddp or fsdp (ranks to stand for)")
    check_parallel(workload, workload.parallel, world_size)
    settings = (settings or ProbeSettings()).model_copy(update={"simulated_ranks": True})
    started = time.perf_counter()
    with (
        fake_process_group(world_size),
        # Before the prober, which shards the model in place (a sharded model cannot be
        # copied): the dry run's fake copy is sharded on its own, as this rank's is.
        DryRun(
            workload, backend, headroom=headroom, measured_as=with_one_collective_in_flight
        ) as dry_run,
        backend.session(),
        Prober(workload, backend, headroom=headroom, settings=settings, rank=0) as prober,
    ):
        keys = (workload_key(workload, prober.optimizer), device_key(backend))
        probe = observed(guarded_until_a_step_runs(with_one_collective_in_flight(prober)), observer)
        outcome = run_search(
            strategy,
            probe,
            cap=size_cap,
            budget_bytes=prober.budget_bytes,
            predict=dry_run if dry_run.available else None,
        )
        info = workload_info(workload, prober.optimizer)
    return build_profile(
        keys=keys,
        workload=info,
        device=backend.describe(),
        headroom=headroom,
        budget_bytes=prober.budget_bytes,
        strategy=strategy,
        size_cap=size_cap,
        outcome=outcome,
        settings=settings,
        world_size=world_size,
        parallel=workload.parallel,
        wall_time_s=time.perf_counter() - started,
    )
