"""A fake world's process group and the collective it counts in flight: what a fake world's
profile (:mod:`tuner.engine.fake_world`) and the dry run of a rank
(:mod:`tuner.engine.dry_run`) share, in a module of its own so that neither imports the
other."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tuner.core.errors import BadInputError
from tuner.core.results import ProbeResult
from tuner.engine.backends.base import plain_tensors
from tuner.engine.probe import Prober

# The operator namespaces of torch's collectives (c10d's own and the functional ones).
COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")


@contextmanager
def fake_process_group(world_size: int) -> Iterator[None]:
    """Join a fake world of ``world_size`` ranks as rank 0 for the block's duration."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise BadInputError(
            "this process already belongs to a process group: profile a fake world from a "
            "process of its own (the tuner command line, not inside torchrun)"
        )
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


class LargestCollective(TorchDispatchMode):
    """The largest storage any collective operator reads or writes while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.largest_bytes = 0

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace in COLLECTIVE_NAMESPACES:
            for leaf in tree_leaves((args, kwargs, out)):
                if isinstance(leaf, torch.Tensor):
                    for plain in plain_tensors(leaf):
                        self.largest_bytes = max(
                            self.largest_bytes, plain.untyped_storage().nbytes()
                        )
        return out


def with_one_collective_in_flight(prober: Prober) -> Callable[[int], ProbeResult]:
    """``prober`` whose results count the largest collective buffer of the step as held at
    the peak (``collective_copies_bytes``), and fit only with it."""

    def probe(size: int) -> ProbeResult:
        largest = LargestCollective()
        with largest:
            result = prober(size)
        if result.breakdown is None or result.peak_reserved_bytes is None:
            return result  # out of memory: nothing to add to
        held = result.model_copy(
            update={
                "breakdown": result.breakdown.model_copy(
                    update={"collective_copies_bytes": largest.largest_bytes}
                )
            }
        )
        footprint = held.footprint_bytes or 0
        fits = result.fits and footprint <= prober.budget_bytes
        return held.model_copy(update={"fits": fits})

    return probe
