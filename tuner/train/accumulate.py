"""The training-loop side: one optimizer step over a batch, in micro batches.

    global batch = micro batch × accumulation steps × data-parallel size

The data-parallel size is the ``dp`` of the run's :class:`~tuner.core.shape.MeshShape`:
the world size, or ``world size / tp`` on a 2-D mesh (FSDP × tensor parallelism), where
the ``tp`` ranks of each data-parallel group compute every micro batch together: they are
given the same batch (drawn by the rank's group, ``MeshShape.group_of(rank)``; a group
whose ranks hold different batches is refused), split it identically, and count its
samples and loss units once for the group.

Given the batch a data loader yields for one optimizer step on this rank, the
accumulator splits it into micro batches whose sizes differ by at most one (or runs the
split it is given), moves each to the model's device as it is used, runs forward and
backward on each, and steps once. Keep the batch on the host: the device then holds one
micro batch at a time, which is what the profile measured (a ``DataLoader`` with
``pin_memory=True`` makes the copies asynchronous).

The accumulated gradient equals the full batch's:

    g = (1 / U) · Σᵢ uᵢ · ∇ meanᵢ  =  (1 / U) · Σᵢ ∇ sumᵢ

where micro batch ``i`` has ``uᵢ`` loss units (samples, or tokens that are not padding)
and ``U`` is the number of units in the whole batch (of every data-parallel group, under
torch.distributed). So a token-level loss gets the mean over every token of the batch,
not the mean of per-micro-batch means. ``loss_fn`` returns the mean (``loss_units``
counts ``uᵢ`` ahead of the forward) or the pair ``(sumᵢ, uᵢ)``
(:mod:`tuner.train.micro_batches`). A micro batch with no units adds nothing: its
backward is skipped, or, where it carries a collective the other ranks wait for, runs
with zero gradients.

An out-of-memory in any micro batch frees what it held, puts back the running statistics
its forwards updated, halves the micro batch size and restarts the same batch from its
first sample, so no sample is lost or counted twice. Under torch.distributed every rank
learns of any rank's out-of-memory and all move to the same smaller size together. One in
the optimizer step is retried once where that is exact (:mod:`tuner.train.recovery`).
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import math
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from tuner.core.errors import BadInputError
from tuner.core.parallel import Parallel
from tuner.core.plan import balanced_split, expand, format_split
from tuner.engine.backends import is_out_of_memory
from tuner.engine.batching import Batch, batch_size_of, batch_tensors, slice_batch, to_device
from tuner.engine.parallel import check_parallel, parallelize, sync_context
from tuner.engine.workload import Precision, Workload, autocast
from tuner.train.collectives import (
    World,
    all_reduce_sum,
    any_rank_failed,
    average_gradients,
    check_same_batch,
    clip_grad_norm,
    current_world,
)
from tuner.train.micro_batches import ForwardWatch, KeepOutputs, count_units, read_loss
from tuner.train.recovery import RunningStats, free_memory, step_optimizer

LossFn = Callable[[nn.Module, Batch], Any]  # a mean, or (sum, count)
OomCallback = Callable[[int, int, str], None]  # (failed size, new size, message)
SyncMode = Literal["ddp", "safe"]

_warned_batchnorm: weakref.WeakSet[nn.Module] = weakref.WeakSet()
_warned_buffer_sync: weakref.WeakSet[nn.Module] = weakref.WeakSet()


class OutOfMemoryAtSizeOneError(torch.OutOfMemoryError):
    """Even one sample per micro batch ran out of memory: nothing smaller can be tried."""


@dataclass(frozen=True)
class StepReport:
    """What one optimizer step did."""

    loss: float  # the batch loss: mean over this rank's loss units (NaN if it had none)
    units: int  # loss units of this rank's batch
    micro_batch_size: int  # the largest micro batch of the split that finally ran
    split: list[int]
    oom_retries: int
    grad_norm: float | None
    optimizer_stepped: bool  # False when fp16's GradScaler skipped a step with inf/nan
    # Per micro batch, with ``keep_outputs``: the model's outputs (detached), or what the
    # ``keep_outputs`` function made of them; None for a micro batch that never ran.
    outputs: list[Any] | None = None


def no_forward_buffer_sync() -> dict[str, bool]:
    """The ``DistributedDataParallel`` argument that stops the buffer broadcast at every
    forward, under this torch's name: ``forward_sync_buffers`` where it exists (newer
    releases), else ``broadcast_buffers``."""
    from torch.nn.parallel import DistributedDataParallel

    accepted = inspect.signature(DistributedDataParallel.__init__).parameters
    name = "forward_sync_buffers" if "forward_sync_buffers" in accepted else "broadcast_buffers"
    return {name: False}


@dataclass
class Accumulator:
    """One optimizer step per batch, accumulated over micro batches.

    Fits into an existing loop in two lines::

        accumulator = Accumulator(model, optimizer, micro_batch_size=plan.micro_batch_size,
                                  loss_fn=loss_fn, split=plan.split)
        for batch in loader:                 # B / dp samples per rank, on the host
            report = accumulator.step(batch)

    ``split`` (a recommendation's micro batch sizes, listed or as its runs
    ``[(size, count), ...]``) runs as given for every batch of its
    sum; other batches (the last of an epoch) and every batch after an out-of-memory are
    split into the fewest micro batches of at most ``micro_batch_size``, sizes within one.

    Under DDP, gradients are all-reduced once per step, never per micro batch:

    - ``sync="safe"`` (default): every micro batch runs under ``no_sync``; then the ranks
      agree on whether any ran out of memory, and gradients are averaged in ~25 MiB
      buckets, every parameter that requires a gradient in a fixed order (zeros where a
      rank used none). An out-of-memory anywhere in the step is recovered on every rank.
      Works on a model not wrapped in DDP too.
    - ``sync="ddp"``: ``no_sync`` on all but the last micro batch, whose backward lets
      DDP overlap the all-reduce with compute. Ranks agree before the last micro batch
      starts, so an out-of-memory in any earlier micro batch is recovered; one inside the
      last cannot be (DDP's reducer would wait for the failed rank), so use it when the
      last micro batch is known to fit. The model must be wrapped in DDP.

    With OOM recovery, build DDP with :func:`no_forward_buffer_sync` when the model has
    buffers: DDP otherwise broadcasts them at every forward, a collective that a rank
    that ran out of memory would not join (a warning says so once).

    With ``parallel`` (a workload's declared DDP or FSDP, which :meth:`for_workload`
    passes and wraps the model for), ``sync`` is not used: the step follows the same rules
    as the probe that measured it (:mod:`tuner.engine.parallel`). DDP synchronises on the
    last micro batch, and gradients are zeroed in place when they are bucket views; FSDP
    reduce-scatters after every micro batch or on the last only (``gradient_sync``), and
    ranks agree on an out-of-memory after the micro batches. FSDP runs collectives inside
    every forward and backward, so only an out-of-memory that every rank meets at the same
    point (equal shapes make that the usual case) is recovered; one on a single rank
    leaves the others waiting until the process group's timeout.

    ``on_oom`` is called on rank 0 only (every rank moved to the same size), so a
    reporter sends one report per out-of-memory, not one per rank.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    micro_batch_size: int
    loss_fn: LossFn
    loss_units: Callable[[Batch], Any] | None = None
    precision: Precision = "fp32"
    max_grad_norm: float | None = None
    scheduler: Any | None = None
    recover_from_oom: bool = True
    on_oom: OomCallback | None = None
    sync: SyncMode = "safe"
    scaler: torch.amp.GradScaler | None = field(default=None)
    parallel: Parallel | None = None
    split: Sequence[int] | Sequence[tuple[int, int]] | None = None
    keep_outputs: KeepOutputs = False
    # ``make_batch(n)``: the workload's own samples, for step_samples (for_workload sets it).
    make_batch: Callable[[int], Batch] | None = None

    def __post_init__(self) -> None:
        if self.micro_batch_size < 1:
            raise BadInputError(f"micro_batch_size must be positive, got {self.micro_batch_size}")
        if self.sync not in ("ddp", "safe"):
            raise BadInputError(f"sync must be 'ddp' or 'safe', got {self.sync!r}")
        # A recommendation's split travels as runs; the loop runs every micro batch.
        self._micro_batches = None if self.split is None else _micro_batches(self.split)
        if self._micro_batches is not None:
            sizes = self._micro_batches
            if not sizes or min(sizes) < 1 or max(sizes) > self.micro_batch_size:
                raise BadInputError(
                    f"split {format_split(sizes)} must list positive micro batch sizes of at "
                    f"most micro_batch_size={self.micro_batch_size}"
                )
        if self.precision == "fp16" and self.scaler is None:
            self.scaler = torch.amp.GradScaler(_device_of(self.model).type)
        self._sum_style: bool | None = None  # learned from the loss function's first result
        self._running_stats = RunningStats.of(self.model)
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
            check_parallel(workload, workload.parallel, current_world().size)
            model = parallelize(workload, workload.parallel, _device_of(model))
        return cls(
            model=model,
            parallel=workload.parallel,
            make_batch=workload.make_batch,
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
        world = current_world(self.parallel)
        self._check_sync(world)
        check_same_batch(batch, world)  # a mesh's tensor-parallel ranks share one batch
        return self._run(batch, samples, world)

    def step_samples(self, samples: int) -> StepReport:
        """One optimizer step over ``samples`` samples that the workload makes itself
        (``make_batch``, which :meth:`for_workload` sets), each micro batch made just
        before its forward and let go after its backward: one micro batch's inputs are in
        memory at a time, as the probe counted them. ``step(make_batch(samples))`` holds
        the whole batch beside the step instead: on the CPU, where a batch cannot wait
        anywhere else, the micro batches waiting their turn are above what the profile
        measured. A retry after an out-of-memory makes its micro batches again.

        The accumulated gradient is the same: each micro batch's loss is weighed by its
        loss units alone, and the gradient divided by their total after the last one (the
        total of a batch not made yet is not known before its first backward). Under
        torch.distributed (the ranks agree on their batches' units first) the batch is made
        whole and stepped as :meth:`step` does."""
        if self.make_batch is None:
            raise BadInputError(
                "step_samples needs the workload's make_batch: build the accumulator with "
                "Accumulator.for_workload, or pass make_batch="
            )
        if type(samples) is not int or samples < 1:
            raise BadInputError(f"samples must be a positive whole number, got {samples!r}")
        world = current_world(self.parallel)
        if world.size > 1:
            return self.step(self.make_batch(samples))
        self._check_sync(world)
        return self._run(_MadeBatch(self.make_batch), samples, world)

    def _run(self, batch: Batch | _MadeBatch, samples: int, world: World) -> StepReport:
        stats = self._running_stats.capture() if self.recover_from_oom else None
        retries = 0
        while True:
            outcome = self._attempt(batch, self._split_for(samples), world)
            if isinstance(outcome, StepReport):
                return dataclasses.replace(outcome, oom_retries=retries)
            failed_size, message = outcome
            if not self.recover_from_oom or stats is None:
                raise torch.OutOfMemoryError(message)
            if failed_size == 1:
                raise OutOfMemoryAtSizeOneError(
                    f"out of memory with micro batch size 1: {message}. Nothing smaller can "
                    "run; use activation checkpointing, bf16 or a device with more memory"
                )
            # The failed forwards moved BatchNorm's statistics: the retry counts them again.
            stats.restore()
            self.micro_batch_size = failed_size // 2
            retries += 1
            if self.on_oom is not None and world.rank == 0:
                self.on_oom(failed_size, self.micro_batch_size, message)

    def _split_for(self, samples: int) -> list[int]:
        given = self._micro_batches
        if given is not None and sum(given) == samples and max(given) <= self.micro_batch_size:
            return list(given)
        return balanced_split(samples, min(self.micro_batch_size, samples))

    # -- one attempt at a batch -------------------------------------------------------

    def _attempt(
        self, batch: Batch | _MadeBatch, split: list[int], world: World
    ) -> StepReport | tuple[int, str]:
        """A step report, or ``(size that failed, message)`` after an agreed out-of-memory."""
        size = max(split)
        count = len(split)
        device = _device_of(self.model)
        parts: Iterable[Batch]
        # Micro batches made as they are reached: their units are counted when each is
        # made, a mean weighs its units alone, and the gradient is divided by their total
        # after the last one, as with a (sum, count) loss (one process only).
        made_lazily = isinstance(batch, _MadeBatch)
        if isinstance(batch, _MadeBatch):
            parts = batch.parts(split)
            on_device = False
            counted = None
        else:
            made = _slices(batch, split)
            parts = made
            # One look at the whole batch instead of a copy call per tensor per micro batch.
            on_device = all(t.device == device for _, t in batch_tensors(batch))
            # A mean is weighted by units counted before its backward; a (sum, count) loss
            # counts its own, and the gradient is divided by their total after the last one.
            # Totals are over data-parallel groups, and the reducer averages over them: each
            # loss is scaled by the data-parallel size so that the average is the sum.
            counted = None if self._sum_style else [self._units(part) for part in made]
        total_units = all_reduce_sum(sum(counted), world) if counted is not None else 0
        if counted is not None and total_units == 0:
            raise BadInputError("the batch has no loss units (every token is padding?)")
        reducer = self._reducer()
        self._zero_grad()
        # Detached tensors, read once at the end: reading a CUDA value each micro batch
        # would stall the GPU, and summing as we go costs two operators a micro batch.
        # (value, weight, units): a mean weighs its units, a sum is already weighted.
        losses: list[tuple[torch.Tensor, int, torch.Tensor | int]] = []
        outputs: list[Any] = []
        oom_message: str | None = None
        try:
            for index, part in enumerate(parts):
                last = index == count - 1
                if last and world.size > 1 and reducer == "ddp":
                    # DDP commits to all-reducing at the last forward: agree before it.
                    agreed = any_rank_failed(False, size, world)
                    if agreed is not None:
                        self._release()
                        return agreed, "another rank ran out of memory"
                units = counted[index] if counted is not None else None
                if made_lazily:
                    units = self._units(part)
                collective = self._backward_has_collective(index, count, world)
                if units == 0 and world.size == 1:
                    outputs.append(None)  # nothing to learn, no one waiting: skip it
                    continue
                watch = ForwardWatch(
                    zero_gradients=units == 0 and collective, keep=self.keep_outputs, part=part
                )
                hooks = watch.around(self.model) if watch.needed else nullcontext(watch)
                if not on_device:
                    part = to_device(part, device)
                with self._sync_context(index, count, world), hooks:
                    # Without units and with no collective in the backward, only the forward
                    # runs (it may hold collectives: FSDP's all-gather, DDP's buffers).
                    grad = units != 0 or collective
                    with (
                        torch.set_grad_enabled(grad) if not grad else nullcontext(),
                        autocast(self.precision, device.type),
                    ):
                        loss = read_loss(self.loss_fn(self.model, part))
                    self._learn_style(loss.count is not None)
                    if loss.count is not None:
                        losses.append((loss.value.detach(), 1, loss.count))
                        weighted = loss.value * world.data_parallel_size
                    else:
                        assert units is not None
                        if units:
                            losses.append((loss.value.detach(), units, units))
                        dp = world.data_parallel_size
                        # Made lazily: divided by the total after the last micro batch.
                        weighted = loss.value * (
                            units * dp if made_lazily else units * dp / total_units
                        )
                    del loss
                    if grad:
                        (self.scaler.scale(weighted) if self.scaler else weighted).backward()
                    del weighted
                outputs.append(watch.kept)
                del part, watch, hooks  # a made micro batch goes before the next is made
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            # Only the text leaves this block: the traceback holds the micro batch's tensors.
            oom_message = str(exc).strip().splitlines()[0] if str(exc).strip() else "out of memory"
        if oom_message is not None:
            self._release()
            # Tell the others, which abandon the batch with us, and halve from one size.
            agreed = any_rank_failed(True, size, world) if world.size > 1 else size
            return agreed or size, oom_message
        if world.size > 1 and reducer != "ddp":
            agreed = any_rank_failed(False, size, world)
            if agreed is not None:
                self._release()
                return agreed, "another rank ran out of memory"
            if reducer == "safe":
                average_gradients(self.model, world)
        local_units = sum(int(units) for _, _, units in losses)
        if self._sum_style or made_lazily:
            total_units = all_reduce_sum(local_units, world)
            if total_units == 0:
                raise BadInputError("the batch has no loss units (every token is padding?)")
            self._scale_gradients(1 / total_units)
        grad_norm, stepped = self._optimizer_step()
        # After the step the GPU has finished: these reads no longer stall anything.
        loss_sum = sum(float(value) * weight for value, weight, _ in losses)
        return StepReport(
            loss=loss_sum / local_units if local_units else math.nan,
            units=local_units,
            micro_batch_size=size,
            split=split,
            oom_retries=0,
            grad_norm=grad_norm,
            optimizer_stepped=stepped,
            outputs=outputs if self.keep_outputs else None,
        )

    def _learn_style(self, sum_style: bool) -> None:
        if self._sum_style is None:
            self._sum_style = sum_style
        elif self._sum_style != sum_style:
            raise BadInputError(
                "loss_fn returned a mean for some micro batches and (sum, count) for others: "
                "return one form always"
            )

    def _scale_gradients(self, factor: float) -> None:
        with torch.no_grad():
            for parameter in self.model.parameters():
                if parameter.grad is not None:
                    parameter.grad.mul_(factor)

    def _optimizer_step(self) -> tuple[float | None, bool]:
        grad_norm = None
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # once, after accumulation
        if self.max_grad_norm is not None:
            grad_norm = clip_grad_norm(self.model.parameters(), self.max_grad_norm)
        stepped = True
        if self.scaler is not None:
            scaler = self.scaler
            scale_before = scaler.get_scale()
            step_optimizer(self.optimizer, lambda: scaler.step(self.optimizer))
            scaler.update()
            stepped = scaler.get_scale() >= scale_before
        else:
            step_optimizer(self.optimizer, self.optimizer.step)
        if self.scheduler is not None and stepped:
            self.scheduler.step()
        return grad_norm, stepped

    def _reducer(self) -> str:
        """Who reduces gradients across ranks: ``safe`` (this class, after the micro
        batches), ``ddp`` (DDP's reducer in the last backward) or ``fsdp``."""
        if self.parallel is not None and self.parallel.distributed:
            return self.parallel.mode
        return self.sync

    def _backward_has_collective(self, index: int, count: int, world: World) -> bool:
        """Whether micro batch ``index``'s backward runs a collective the other ranks
        wait for, so that it must run even with no loss units."""
        if world.size == 1:
            return False
        reducer = self._reducer()
        if reducer == "fsdp":
            return True  # all-gathers in every backward, whether or not it reduces
        return reducer == "ddp" and index == count - 1

    def _check_sync(self, world: World) -> None:
        if world.size == 1 or (self.parallel is not None and self.parallel.distributed):
            return
        no_sync = getattr(self.model, "no_sync", None)
        if self.sync == "ddp" and no_sync is None:
            raise BadInputError(
                f"sync='ddp' on {world.size} ranks needs the model wrapped in "
                "DistributedDataParallel (it has no no_sync), or gradients never meet: "
                "wrap it, or use sync='safe', which averages them itself"
            )
        if (
            self.recover_from_oom
            and no_sync is not None
            and getattr(
                self.model, "forward_sync_buffers", getattr(self.model, "broadcast_buffers", False)
            )
            and any(True for _ in self.model.buffers())
            and self.model not in _warned_buffer_sync
        ):
            _warned_buffer_sync.add(self.model)
            (name,) = no_forward_buffer_sync()
            warnings.warn(
                "DDP broadcasts the model's buffers at every forward, a collective that a "
                "rank recovering from an out-of-memory would not join: build it with "
                f"{name}=False (no_forward_buffer_sync())",
                UserWarning,
                stacklevel=3,
            )

    def _zero_grad(self) -> None:
        parallel = self.parallel or Parallel()
        self.optimizer.zero_grad(set_to_none=parallel.zero_grad_set_to_none)

    def _release(self) -> None:
        """Free what a failed attempt held before the same batch is tried again."""
        self._zero_grad()
        free_memory()

    def _units(self, part: Batch) -> int:
        if self.loss_units is None:
            return batch_size_of(part)
        return count_units(self.loss_units(part))

    def _sync_context(self, index: int, count: int, world: World) -> AbstractContextManager[Any]:
        if self.parallel is not None and self.parallel.distributed:
            return sync_context(self.model, self.parallel, index, count)
        last = index == count - 1
        no_sync = getattr(self.model, "no_sync", None)
        if no_sync is None or world.size == 1 or (last and self.sync == "ddp"):
            return nullcontext()  # with "ddp", DDP all-reduces during the last backward
        context: AbstractContextManager[Any] = no_sync()
        return context


# -- small helpers ---------------------------------------------------------------------


def _micro_batches(split: Sequence[int] | Sequence[tuple[int, int]]) -> list[int]:
    """Every micro batch of ``split``: sizes as listed, or runs ``(size, count)`` expanded."""
    return [
        size
        for item in split
        for size in (expand([item]) if isinstance(item, tuple | list) else [item])
    ]


@dataclass(frozen=True)
class _MadeBatch:
    """A batch not made yet: each micro batch is made by ``make`` when it is reached."""

    make: Callable[[int], Batch]

    def parts(self, split: list[int]) -> Iterator[Batch]:
        for size in split:
            yield self.make(size)


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
