"""Batches as data loaders yield them: a tensor, or tuples, lists and dicts of tensors.

The sample dimension is dimension 0 of every tensor in the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeAlias

import torch

Batch: TypeAlias = Any


def batch_tensors(batch: Batch) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in ``batch`` with a path such as ``[0]`` or ``['input_ids']``."""
    yield from _walk(batch, "")


def _walk(node: Batch, path: str) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(node, torch.Tensor):
        yield path or "batch", node
    elif isinstance(node, Mapping):
        for key in sorted(node, key=str):
            yield from _walk(node[key], f"{path}[{key!r}]")
    elif isinstance(node, list | tuple):
        for index, item in enumerate(node):
            yield from _walk(item, f"{path}[{index}]")


def map_tensors(batch: Batch, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
    """A batch of the same structure with ``fn`` applied to every tensor."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return type(batch)({key: map_tensors(value, fn) for key, value in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # named tuples
        return type(batch)(*(map_tensors(item, fn) for item in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(map_tensors(item, fn) for item in batch)
    return batch


def to_device(batch: Batch, device: torch.device) -> Batch:
    return map_tensors(batch, lambda t: t.to(device, non_blocking=True))


def batch_size_of(batch: Batch) -> int:
    """Samples in ``batch``: the common size of dimension 0 of its tensors."""
    sizes = {path: tensor.shape[0] for path, tensor in batch_tensors(batch) if tensor.dim() > 0}
    if not sizes:
        raise ValueError("a batch must contain at least one tensor with a sample dimension")
    distinct = set(sizes.values())
    if len(distinct) > 1:
        raise ValueError(f"the tensors of a batch disagree on the number of samples: {sizes}")
    return distinct.pop()


def slice_batch(batch: Batch, start: int, stop: int) -> Batch:
    """Samples ``start:stop`` of ``batch``, as views where the tensors allow it."""
    return map_tensors(batch, lambda t: t[start:stop] if t.dim() > 0 else t)
