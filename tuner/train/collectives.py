"""The few collectives the accumulator runs under torch.distributed, one place for all.

Every function here is called by every rank in the same order, whatever happened on
that rank (an out-of-memory, a micro batch with no loss units, a parameter it never
used): a collective that one rank skips leaves the others waiting until the process
group's timeout.

On a 2-D mesh (FSDP × tensor parallelism) the ``tp`` ranks of one data-parallel group
compute each micro batch together, on the same samples: what counts samples or loss units
across the world counts data-parallel groups, once each (:func:`all_reduce_sum`), and the
ranks of a group are held to one batch (:func:`check_same_batch`). What every rank must
agree on (an out-of-memory anywhere) stays world-wide.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tuner.core.errors import BadInputError
from tuner.core.parallel import Parallel
from tuner.core.shape import ONE_PROCESS, MeshShape
from tuner.engine.batching import Batch, batch_size_of, batch_tensors

BUCKET_BYTES = 25 * 2**20


@dataclass(frozen=True)
class World:
    rank: int
    device: torch.device  # where collectives' tensors live: the GPU under NCCL
    # The process group as dp × tp (tp 1 without a mesh): the ranks of a data-parallel
    # group are adjacent and share their samples.
    mesh: MeshShape = ONE_PROCESS

    @property
    def size(self) -> int:
        return self.mesh.world_size

    @property
    def data_parallel_size(self) -> int:
        """The groups that see different samples: what gradients are averaged over."""
        return self.mesh.dp

    @property
    def group(self) -> int:
        """This rank's data-parallel group."""
        return self.mesh.group_of(self.rank)


def current_world(parallel: Parallel | None = None) -> World:
    """The process group as the accumulator sees it; with ``parallel`` on a mesh, laid out
    as ``dp × tp`` (:mod:`tuner.engine.mesh`)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return World(0, torch.device("cpu"))
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )
    size = dist.get_world_size()
    # Refuses a world that is not dp × tp.
    mesh = parallel.mesh(size) if parallel is not None and parallel.has_mesh else MeshShape(size)
    return World(dist.get_rank(), device, mesh)


def all_reduce_sum(value: int, world: World) -> int:
    """The sum of ``value`` over the data-parallel groups: over every rank without a mesh;
    on a mesh once a group, whose ranks must hold the same value (else refused, on every
    rank)."""
    if world.size == 1:
        return value
    import torch.distributed as dist

    if not world.mesh.is_mesh:
        tensor = torch.tensor([value], dtype=torch.int64, device=world.device)
        dist.all_reduce(tensor)
        return int(tensor.item())
    rows = _agreed_per_group(
        torch.tensor([value], dtype=torch.float64), world, "loss units of the batch"
    )
    return int(rows[:, 0].sum().item())


def check_same_batch(batch: Batch, world: World) -> None:
    """Refuse, on every rank, a batch that the tensor-parallel ranks of a group do not
    share: its size and a position-weighted checksum of its samples are compared within
    each group (one small all-reduce). Nothing to compare without a mesh."""
    if not world.mesh.is_mesh or world.size == 1:
        return
    _agreed_per_group(_fingerprint(batch), world, "batch")


def _fingerprint(batch: Batch) -> torch.Tensor:
    """``[samples, Σ, Σ weighted by position]`` of every tensor's per-sample sums: equal on
    ranks holding the same batch (the same operators on the same values), different,
    almost surely, for other samples or the same ones in another order."""
    total = torch.zeros((), dtype=torch.float64)
    weighted = torch.zeros((), dtype=torch.float64)
    for index, (_, tensor) in enumerate(batch_tensors(batch)):
        data = tensor.detach()
        rows = data.reshape(data.shape[0], -1) if data.dim() else data.reshape(1, 1)
        if rows.is_complex():
            rows = torch.view_as_real(rows).reshape(rows.shape[0], -1)
        sums = rows.to(torch.float64).sum(dim=1).nan_to_num().cpu()
        positions = torch.arange(1, sums.numel() + 1, dtype=torch.float64)
        total = total + sums.sum() * (index + 1)
        weighted = weighted + (sums * positions).sum() * (index + 1)
    return torch.stack(
        [torch.tensor(float(batch_size_of(batch)), dtype=torch.float64), total, weighted]
    )


def _agreed_per_group(values: torch.Tensor, world: World, what: str) -> torch.Tensor:
    """``values`` (1-D) of every data-parallel group, one row a group, after checking that
    the ranks of each group hold the same ones. One all-reduce (max) over the world of
    ``[values, -values]`` in this rank's group's row: a row agrees when both halves meet."""
    import torch.distributed as dist

    count = values.numel()
    table = torch.full((world.data_parallel_size, 2 * count), float("-inf"), dtype=torch.float64)
    table[world.group, :count] = values
    table[world.group, count:] = -values
    table = table.to(world.device)
    dist.all_reduce(table, op=dist.ReduceOp.MAX)
    table = table.cpu()
    highest, lowest = table[:, :count], -table[:, count:]
    differing = [
        g for g in range(world.data_parallel_size) if not torch.equal(highest[g], lowest[g])
    ]
    if differing:
        ranks = ", ".join(
            f"{world.mesh.ranks_of(g)[0]}..{world.mesh.ranks_of(g)[-1]}" for g in differing
        )
        raise BadInputError(
            f"the tensor-parallel ranks of data-parallel group(s) {differing} (ranks {ranks}) "
            f"were given different {what}s: a tensor-parallel group computes each micro batch "
            "together, so its ranks must see the same samples; draw them by the rank's "
            "data-parallel group (tuner.core.shape.MeshShape.group_of), e.g. "
            f"DistributedSampler(num_replicas={world.data_parallel_size}, "
            f"rank=MeshShape({world.size}, {world.mesh.tp}).group_of(rank))"
        )
    return highest


def any_rank_failed(failed: bool, size: int, world: World) -> int | None:
    """All ranks say whether they ran out of memory; ``None`` if none did, else the
    smallest size any rank ran (so that every rank halves from the same size)."""
    import torch.distributed as dist

    flags = torch.tensor([int(failed), -size], dtype=torch.int64, device=world.device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return None if flags[0].item() == 0 else int(-flags[1].item())


def average_gradients(model: nn.Module, world: World) -> None:
    """Average gradients over ranks in buckets of about 25 MiB: once per step.

    Every parameter that requires a gradient takes part, in the model's own order, so
    that the ranks' flat buffers line up even when a rank left some parameters unused (a
    branch, an expert it routed nothing to): that rank sends zeros for them, as DDP does.
    A parameter no rank used keeps ``grad = None``, as it would in one process, so the
    optimizer skips it (weight decay and momentum included); one small all-reduce of a
    presence mask learns which those are.
    """
    import torch.distributed as dist

    parameters = [p for p in model.parameters() if p.requires_grad]
    present = torch.tensor(
        [p.grad is not None for p in parameters], dtype=torch.int32, device=world.device
    )
    dist.all_reduce(present, op=dist.ReduceOp.MAX)
    used = [p for p, anywhere in zip(parameters, present.tolist(), strict=True) if anywhere]
    for parameter in used:
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
    grads = [p.grad for p in used if p.grad is not None]
    for bucket in buckets(grads):
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat)
        flat /= world.size
        offset = 0
        for grad in bucket:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()


def buckets(grads: Sequence[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    """Consecutive runs of one dtype, each at most :data:`BUCKET_BYTES` (or one tensor)."""
    bucket: list[torch.Tensor] = []
    size = 0
    for grad in grads:
        if bucket and (
            size + grad.numel() * grad.element_size() > BUCKET_BYTES
            or grad.dtype != bucket[0].dtype
        ):
            yield bucket
            bucket, size = [], 0
        bucket.append(grad)
        size += grad.numel() * grad.element_size()
    if bucket:
        yield bucket


def clip_grad_norm(parameters: Iterable[nn.Parameter], max_norm: float) -> float:
    """``torch.nn.utils.clip_grad_norm_`` that also takes the gradients of a 2-D mesh,
    DTensors on different meshes (a tensor-parallel weight on ``(dp, tp)``, a norm's on
    ``dp`` alone), which torch's cannot stack: the norm of each mesh's gradients in full
    (every shard counted once, replicas once), then of those. Returns the total norm
    before clipping, the same on every rank."""
    parameters = list(parameters)
    grads = [p.grad for p in parameters if p.grad is not None]
    by_mesh: dict[Any, list[torch.Tensor]] = {}
    for grad in grads:
        by_mesh.setdefault(getattr(grad, "device_mesh", None), []).append(grad)
    if len(by_mesh) <= 1:
        return float(torch.nn.utils.clip_grad_norm_(parameters, max_norm))
    with torch.no_grad():
        norms = []
        for mesh_grads in by_mesh.values():
            norm = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g) for g in mesh_grads])
            )
            full = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
            norms.append(full.float().cpu())
        total = torch.linalg.vector_norm(torch.stack(norms))
        coefficient = float(torch.clamp(max_norm / (total + 1e-6), max=1.0))
        if coefficient < 1.0:
            for grad in grads:
                grad.mul_(coefficient)
    return float(total)
