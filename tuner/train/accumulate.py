"""The training-loop side: one optimizer step over a batch, in micro batches.

    global batch = micro batch × accumulation steps × world size

Given the batch a data loader yields for one optimizer step on this rank, the
accumulator splits it into micro batches (the last may be smaller), runs forward and
backward on each, and steps once. The accumulated gradient equals the full batch's:
``loss_fn`` returns the mean over its loss units (samples, or tokens that are not
padding), and micro batch ``i`` is weighted by ``uᵢ / U`` where ``U`` is the number of
units in the whole batch (on every rank, under torch.distributed). So a token-level loss
gets the mean over every token of the batch, not the mean of per-micro-batch means.

An out-of-memory in any micro batch frees what it held, halves the micro batch size and
restarts the same batch from its first sample, so no sample is lost or counted twice.
Under torch.distributed every rank learns of any rank's out-of-memory and all move to the
same smaller size together.
"""

from __future__ import annotations

import gc
import itertools
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from tuner.core.errors import BadInputError
from tuner.core.parallel import Parallel
from tuner.core.plan import split_batch
from tuner.engine.backends import is_out_of_memory
from tuner.engine.batching import Batch, batch_size_of, slice_batch
from tuner.engine.parallel import check_parallel, parallelize, sync_context
from tuner.engine.workload import Precision, Workload, autocast

LossFn = Callable[[nn.Module, Batch], torch.Tensor]
OomCallback = Callable[[int, int, str], None]  # (failed size, new size, message)
SyncMode = Literal["ddp", "safe"]

_BUCKET_BYTES = 25 * 2**20
_warned_batchnorm: weakref.WeakSet[nn.Module] = weakref.WeakSet()


class OutOfMemoryAtSizeOneError(torch.OutOfMemoryError):
    """Even one sample per micro batch ran out of memory: nothing smaller can be tried."""


@dataclass(frozen=True)
class StepReport:
    """What one optimizer step did."""

    loss: float  # the batch loss: mean over all loss units of this rank's batch
    units: int  # loss units of this rank's batch
    micro_batch_size: int  # the size that finally ran
    split: list[int]
    oom_retries: int
    grad_norm: float | None
    optimizer_stepped: bool  # False when fp16's GradScaler skipped a step with inf/nan


@dataclass
class Accumulator:
    """One optimizer step per batch, accumulated over micro batches.

    Fits into an existing loop in two lines::

        accumulator = Accumulator(model, optimizer, micro_batch_size=plan.micro_batch_size,
                                  loss_fn=loss_fn)
        for batch in loader:                 # B / W samples per rank
            report = accumulator.step(batch)

    Under DDP, gradients are all-reduced once per step, never per micro batch:

    - ``sync="safe"`` (default): every micro batch runs under ``no_sync``; then the ranks
      agree on whether any ran out of memory, and gradients are averaged in ~25 MiB
      buckets. An out-of-memory anywhere in the step is recovered on every rank.
    - ``sync="ddp"``: ``no_sync`` on all but the last micro batch, whose backward lets
      DDP overlap the all-reduce with compute. Ranks agree before the last micro batch
      starts, so an out-of-memory in any earlier micro batch is recovered; one inside the
      last cannot be (DDP's reducer would wait for the failed rank), so use it when the
      last micro batch is known to fit.

    With OOM recovery, build DDP with ``forward_sync_buffers=False`` when the model has
    buffers: DDP otherwise broadcasts them at every forward, a collective that a rank
    that ran out of memory would not join.

    With ``parallel`` (a workload's declared DDP or FSDP, which :meth:`for_workload`
    passes and wraps the model for), ``sync`` is not used: the step follows the same rules
    as the probe that measured it (:mod:`tuner.engine.parallel`). DDP synchronises on the
    last micro batch, and gradients are zeroed in place when they are bucket views; FSDP
    reduce-scatters after every micro batch or on the last only (``gradient_sync``), and
    ranks agree on an out-of-memory after the micro batches. FSDP runs collectives inside
    every forward and backward, so only an out-of-memory that every rank meets at the same
    point (equal shapes make that the usual case) is recovered; one on a single rank
    leaves the others waiting until the process group's timeout.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    micro_batch_size: int
    loss_fn: LossFn
    loss_units: Callable[[Batch], int] | None = None
    precision: Precision = "fp32"
    max_grad_norm: float | None = None
    scheduler: Any | None = None
    recover_from_oom: bool = True
    on_oom: OomCallback | None = None
    sync: SyncMode = "safe"
    scaler: torch.amp.GradScaler | None = field(default=None)
    parallel: Parallel | None = None

    def __post_init__(self) -> None:
        if self.micro_batch_size < 1:
            raise BadInputError(f"micro_batch_size must be positive, got {self.micro_batch_size}")
        if self.sync not in ("ddp", "safe"):
            raise BadInputError(f"sync must be 'ddp' or 'safe', got {self.sync!r}")
        if self.precision == "fp16" and self.scaler is None:
            self.scaler = torch.amp.GradScaler(_device_of(self.model).type)
        _warn_about_batchnorm(self.model)

    @classmethod
    def for_workload(cls, workload: Workload, micro_batch_size: int, **options: Any) -> Accumulator:
        """An accumulator for a :class:`~tuner.engine.workload.Workload`'s model, optimizer and
        loss. A workload declared DDP or FSDP has its model wrapped here the way it was
        profiled (the process group must be initialized), then its optimizer built."""
        model = workload.model
        if workload.parallel.distributed:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                raise BadInputError(
                    f"{workload.name} is declared {workload.parallel.mode}: initialize "
                    "torch.distributed first (run under torchrun), or train in one process "
                    "with workload.parallel = Parallel()"
                )
            check_parallel(workload, workload.parallel, _world().size)
            model = parallelize(workload, workload.parallel, _device_of(model))
        return cls(
            model=model,
            parallel=workload.parallel,
            optimizer=workload.build_optimizer(),
            micro_batch_size=micro_batch_size,
            loss_fn=workload.loss_fn,
            loss_units=workload.loss_units,
            precision=workload.precision,
            **options,
        )

    def step(self, batch: Batch) -> StepReport:
        """Forward and backward over every micro batch of ``batch``, then one optimizer step."""
        samples = batch_size_of(batch)
        retries = 0
        while True:
            size = min(self.micro_batch_size, samples)
            split = split_batch(samples, size)
            outcome = self._attempt(batch, split)
            if isinstance(outcome, StepReport):
                return StepReport(
                    loss=outcome.loss,
                    units=outcome.units,
                    micro_batch_size=size,
                    split=split,
                    oom_retries=retries,
                    grad_norm=outcome.grad_norm,
                    optimizer_stepped=outcome.optimizer_stepped,
                )
            failed_size, message = outcome
            if not self.recover_from_oom:
                raise torch.OutOfMemoryError(message)
            if failed_size == 1:
                raise OutOfMemoryAtSizeOneError(
                    f"out of memory with micro batch size 1: {message}. Nothing smaller can "
                    "run; use activation checkpointing, bf16 or a device with more memory"
                )
            self.micro_batch_size = failed_size // 2
            retries += 1
            if self.on_oom is not None:
                self.on_oom(failed_size, self.micro_batch_size, message)

    # -- one attempt at a batch -------------------------------------------------------

    def _attempt(self, batch: Batch, split: list[int]) -> StepReport | tuple[int, str]:
        """A step report, or ``(size that failed, message)`` after an agreed out-of-memory."""
        world = _world()
        size = split[0]
        parts = _slices(batch, split)
        units = [self._units(part) for part in parts]
        total_units = _all_reduce_sum(sum(units), world)
        if total_units == 0:
            raise BadInputError("the batch has no loss units (every token is padding?)")
        # DDP and FSDP average gradients over ranks, so each rank's share is scaled up by W.
        scale = world.size / total_units
        reducer = self._reducer()
        self._zero_grad()
        # Detached tensors, read once at the end: reading a CUDA value each micro batch
        # would stall the GPU, and summing as we go costs two operators a micro batch.
        losses: list[torch.Tensor] = []
        oom_message: str | None = None
        try:
            for index, (part, part_units) in enumerate(zip(parts, units, strict=True)):
                last = index == len(parts) - 1
                if last and world.size > 1 and reducer == "ddp":
                    # DDP commits to all-reducing at the last forward: agree before it.
                    agreed = _any_rank(False, size, world)
                    if agreed is not None:
                        self._release()
                        return agreed, "another rank ran out of memory"
                with self._sync_context(index, len(parts), world):
                    with self._autocast():
                        loss = self.loss_fn(self.model, part)
                    losses.append(loss.detach())
                    weighted = loss * (part_units * scale)
                    del loss
                    (self.scaler.scale(weighted) if self.scaler else weighted).backward()
                    del weighted
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            # Only the text leaves this block: the traceback holds the micro batch's tensors.
            oom_message = str(exc).strip().splitlines()[0] if str(exc).strip() else "out of memory"
        if oom_message is not None:
            self._release()
            # Tell the others, which abandon the batch with us, and halve from one size.
            agreed = _any_rank(True, size, world) if world.size > 1 else size
            return agreed or size, oom_message
        if world.size > 1 and reducer != "ddp":
            agreed = _any_rank(False, size, world)
            if agreed is not None:
                self._release()
                return agreed, "another rank ran out of memory"
            if reducer == "safe":
                _all_reduce_gradients(self.model, world)
        grad_norm, stepped = self._optimizer_step()
        return StepReport(
            # After the step the GPU has finished: these reads no longer stall anything.
            loss=sum(float(x) * u for x, u in zip(losses, units, strict=True)) / sum(units),
            units=sum(units),
            micro_batch_size=size,
            split=split,
            oom_retries=0,
            grad_norm=grad_norm,
            optimizer_stepped=stepped,
        )

    def _optimizer_step(self) -> tuple[float | None, bool]:
        grad_norm = None
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # once, after accumulation
        if self.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
            grad_norm = float(norm)
        stepped = True
        if self.scaler is not None:
            scale_before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            stepped = self.scaler.get_scale() >= scale_before
        else:
            self.optimizer.step()
        if self.scheduler is not None and stepped:
            self.scheduler.step()
        return grad_norm, stepped

    def _reducer(self) -> str:
        """Who reduces gradients across ranks: ``safe`` (this class, after the micro
        batches), ``ddp`` (DDP's reducer in the last backward) or ``fsdp``."""
        if self.parallel is not None and self.parallel.distributed:
            return self.parallel.mode
        return self.sync

    def _zero_grad(self) -> None:
        parallel = self.parallel or Parallel()
        self.optimizer.zero_grad(set_to_none=parallel.zero_grad_set_to_none)

    def _release(self) -> None:
        """Free what a failed attempt held before the same batch is tried again."""
        self._zero_grad()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _units(self, part: Batch) -> int:
        units = self.loss_units(part) if self.loss_units is not None else batch_size_of(part)
        if units < 0:
            raise BadInputError(f"loss_units returned {units}; it must count units, >= 0")
        return units

    def _autocast(self) -> AbstractContextManager[Any]:
        return autocast(self.precision, _device_of(self.model).type)

    def _sync_context(self, index: int, count: int, world: _World) -> AbstractContextManager[Any]:
        if self.parallel is not None and self.parallel.distributed:
            return sync_context(self.model, self.parallel, index, count)
        last = index == count - 1
        no_sync = getattr(self.model, "no_sync", None)
        if no_sync is None or world.size == 1 or (last and self.sync == "ddp"):
            return nullcontext()  # with "ddp", DDP all-reduces during the last backward
        context: AbstractContextManager[Any] = no_sync()
        return context


# -- torch.distributed helpers ---------------------------------------------------------


@dataclass(frozen=True)
class _World:
    size: int
    device: torch.device


def _world() -> _World:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return _World(1, torch.device("cpu"))
    backend = dist.get_backend()
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if backend == "nccl"
        else torch.device("cpu")
    )
    return _World(dist.get_world_size(), device)


def _all_reduce_sum(value: int, world: _World) -> int:
    if world.size == 1:
        return value
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=torch.int64, device=world.device)
    dist.all_reduce(tensor)
    return int(tensor.item())


def _any_rank(oom: bool, size: int, world: _World) -> int | None:
    """All ranks say whether they ran out of memory; ``None`` if none did, else the
    smallest size any rank ran (so that every rank halves from the same size)."""
    import torch.distributed as dist

    flags = torch.tensor([int(oom), -size], dtype=torch.int64, device=world.device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return None if flags[0].item() == 0 else int(-flags[1].item())


def _all_reduce_gradients(model: nn.Module, world: _World) -> None:
    """Average gradients over ranks in buckets of about 25 MiB: once per step."""
    import torch.distributed as dist

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    for bucket in _buckets(grads):
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat)
        flat /= world.size
        offset = 0
        for grad in bucket:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()


def _buckets(grads: Sequence[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    bucket: list[torch.Tensor] = []
    size = 0
    for grad in grads:
        if bucket and (
            size + grad.numel() * grad.element_size() > _BUCKET_BYTES
            or grad.dtype != bucket[0].dtype
        ):
            yield bucket
            bucket, size = [], 0
        bucket.append(grad)
        size += grad.numel() * grad.element_size()
    if bucket:
        yield bucket


# -- small helpers ---------------------------------------------------------------------


def _slices(batch: Batch, split: list[int]) -> list[Batch]:
    starts = [0, *itertools.accumulate(split)]
    return [slice_batch(batch, starts[i], starts[i + 1]) for i in range(len(split))]


def _device_of(model: nn.Module) -> torch.device:
    for parameter in model.parameters():
        return parameter.device
    return torch.device("cpu")


def _warn_about_batchnorm(model: nn.Module) -> None:
    if model in _warned_batchnorm:
        return
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        _warned_batchnorm.add(model)
        warnings.warn(
            "the model has BatchNorm layers: with gradient accumulation their statistics "
            "see one micro batch at a time, not the whole batch; consider GroupNorm or "
            "LayerNorm, or SyncBatchNorm across ranks",
            UserWarning,
            stacklevel=3,
        )
