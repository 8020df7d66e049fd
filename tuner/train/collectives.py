"""The few collectives the accumulator runs under torch.distributed, one place for all.

Every function here is called by every rank in the same order, whatever happened on
that rank (an out-of-memory, a micro batch with no loss units, a parameter it never
used): a collective that one rank skips leaves the others waiting until the process
group's timeout.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

BUCKET_BYTES = 25 * 2**20


@dataclass(frozen=True)
class World:
    size: int
    rank: int
    device: torch.device  # where collectives' tensors live: the GPU under NCCL


def current_world() -> World:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return World(1, 0, torch.device("cpu"))
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )
    return World(dist.get_world_size(), dist.get_rank(), device)


def all_reduce_sum(value: int, world: World) -> int:
    if world.size == 1:
        return value
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=torch.int64, device=world.device)
    dist.all_reduce(tensor)
    return int(tensor.item())


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
