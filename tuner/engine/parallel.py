"""A workload's model made parallel the way it trains, and the per-micro-batch sync rule
the probe and the accumulator share.

``parallelize`` wraps the model for the declared mode: ``DistributedDataParallel`` with
the spec's options, or the workload's own ``shard`` function given a ``fully_shard``
preconfigured with the spec's options (call it per transformer block, then on the root);
on a 2-D mesh the tensor-parallel plan runs first and ``fully_shard`` shards over the
mesh's ``dp`` dimension (:mod:`tuner.engine.mesh`).
Call it in training too, so that the run is the one that was profiled.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

from tuner.core.errors import BadInputError
from tuner.core.parallel import Parallel
from tuner.engine.mesh import apply_plan, auto_plan, build_mesh
from tuner.engine.workload import Workload

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def check_parallel(workload: Workload, parallel: Parallel, world_size: int) -> None:
    """Refuse, in one line each, what cannot be profiled or trained at ``world_size``."""
    if parallel.mode == "fsdp" and workload.shard is None:
        raise BadInputError(
            f"--parallel fsdp: {workload.name} does not say how to shard its model; give "
            "Workload(shard=fn), where fn(model, fully_shard) calls fully_shard on each "
            "transformer block, then on the model"
        )
    if parallel.mode == "fsdp" and isinstance(workload.optimizer, torch.optim.Optimizer):
        raise BadInputError(
            f"--parallel fsdp: the optimizer of {workload.name} was built before sharding; "
            "give Workload(optimizer=lambda params: ...) so it is built on the sharded parameters"
        )
    if parallel.has_mesh and workload.tp_plan is None and parallel.tp_plan == "workload":
        raise BadInputError(
            f"tp_plan=workload: {workload.name} gives no plan; give Workload(tp_plan=fn), where "
            "fn(model, tp_mesh) calls parallelize_module, or use tp_plan=llama"
        )
    parallel.mesh(world_size)  # refuses a world that is not dp × tp
    if parallel.tp_plan == "auto":
        # Resolved here too, so that a model the plan cannot split is refused before any
        # rank starts.
        if parallel.sequence_parallel:
            raise BadInputError(
                "sequence_parallel=true is for tp_plan=llama, which shards the norms too; "
                "with tp_plan=auto use sequence_parallel=false"
            )
        auto_plan(workload.model, parallel.tp)
    if world_size > 1 and not accepts_rank(workload.make_batch):
        raise BadInputError(
            f"--world-size {world_size}: make_batch of {workload.name} ignores the rank, so "
            "every rank would see the same samples; give it a keyword, make_batch(n, rank=0), "
            "that draws rank r's samples (e.g. from torch.Generator().manual_seed(r))"
        )


def accepts_rank(make_batch: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(make_batch).parameters
    except (TypeError, ValueError):
        return False
    return "rank" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


def parallelize(workload: Workload, parallel: Parallel, device: torch.device) -> nn.Module:
    """The module a training step calls: the DDP wrapper, or the model sharded in place."""
    model = workload.model
    if parallel.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            gradient_as_bucket_view=parallel.gradient_as_bucket_view,
            bucket_cap_mb=parallel.bucket_cap_mb,
            static_graph=parallel.static_graph,
        )
    if parallel.mode == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(
            param_dtype=_DTYPES.get(parallel.param_dtype or ""),
            reduce_dtype=_DTYPES.get(parallel.reduce_dtype or ""),
        )
        options: dict[str, Any] = {}
        if parallel.has_mesh:
            # Tensor parallelism first, on the mesh's inner dimension; FSDP then shards the
            # tensor-parallel shards across the data-parallel groups (PyTorch's 2-D order).
            import torch.distributed as dist

            mesh = build_mesh(parallel, dist.get_world_size(), device)
            apply_plan(model, parallel, workload.tp_plan, mesh)
            options["mesh"] = mesh["dp"]
        shard = functools.partial(
            fully_shard,
            reshard_after_forward=parallel.reshard_after_forward,
            mp_policy=policy,
            **options,
        )
        if workload.shard is None:
            raise BadInputError(f"{workload.name} has no shard function for FSDP")
        workload.shard(model, shard)
        return model
    return model


def sync_context(
    module: nn.Module, parallel: Parallel, index: int, count: int
) -> AbstractContextManager[Any]:
    """Enter around micro batch ``index`` of ``count``: DDP's ``no_sync`` on all but the
    last; for FSDP, gradient sync switched per the spec's ``gradient_sync``."""
    syncs = parallel.syncs_on(index, count)
    if parallel.mode == "ddp" and not syncs:
        context: AbstractContextManager[Any] = module.no_sync()  # type: ignore[operator]
        return context
    if parallel.mode == "fsdp":
        module.set_requires_gradient_sync(syncs)  # type: ignore[operator]
    return nullcontext()
