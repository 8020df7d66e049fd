"""One measured training step at micro batch size ``m``.

A probe runs ``warmup_steps`` optimizer steps (creating optimizer state, workspaces and
caches), then measures ``measure_steps`` more; each step accumulates gradients over
``microbatches_per_step`` micro batches of ``m`` samples. It fits when it finishes,
``peak reserved + non-torch ≤ (1 − headroom) × capacity``, and the allocator needed no
retries. The warm-up and measured steps run as they train: no dispatch mode and no hook is
active in them (under a mode autograd accumulates some gradients out of place, copies
training never makes); what needs one (the memory timeline, the activations each block
saves) is gathered on one more step after them, whose peak decides nothing. Running out
of memory is a measurement ("does not fit"); any other exception propagates unchanged.
Afterwards the model, optimizer, RNG and train/eval flags are as they were, and after an
out-of-memory the device is back to its baseline.

Under DDP or FSDP (a rank of :mod:`tuner.engine.launch`) the model is wrapped the way it
trains, and each step follows the rules the accumulator follows: the same gradient
zeroing and the same micro batches synchronising (:func:`tuner.engine.parallel.sync_context`).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from tuner.core.errors import WorkloadError
from tuner.core.results import MemoryBreakdown, ProbeResult, ProbeSettings
from tuner.core.speeds import SpeedCurve, TimedSize
from tuner.engine.backends import (
    Backend,
    PeakReading,
    is_out_of_memory,
    iter_tensors,
    storage_bytes,
)
from tuner.engine.batching import Batch, batch_size_of, batch_tensors, to_device
from tuner.engine.parallel import parallelize, sync_context
from tuner.engine.peak import BlockActivations, peak_phase
from tuner.engine.state import TrainingState
from tuner.engine.workload import Workload, autocast

# How far past its capacity a CPU rank runs a step before it stops (see Prober.stop_at).
DEFERRED_STOP = 2.0


def fits_budget(reading: PeakReading, *, non_torch_bytes: int, budget_bytes: int) -> bool:
    """``peak reserved + non-torch + collective copies ≤ budget`` and no allocator retries.

    The collective copies are what gloo holds on the CPU beyond the GPU-standing peak
    (:mod:`tuner.engine.backends.allocations`): they are real memory of the process, so
    training on the CPU must fit with them, though a GPU's peak would not carry them.
    A retry means the caching allocator had to free its cache and try again to satisfy a
    request: the size runs only by thrashing, and a slightly longer input would not run.
    """
    held = reading.reserved_bytes + reading.collective_copies_bytes
    return held + non_torch_bytes <= budget_bytes and reading.alloc_retries == 0


class Prober:
    """Runs probes of one workload on one backend. Use as a context manager: leaving it
    puts the user's objects back one last time."""

    def __init__(
        self,
        workload: Workload,
        backend: Backend,
        *,
        headroom: float = 0.05,
        settings: ProbeSettings | None = None,
        rank: int = 0,
        locate: bool = False,
        timeline: bool = False,
    ) -> None:
        self.workload = workload
        # Whether measured steps file saved activations under their blocks (tuner.engine.peak).
        self.locate = locate
        # Whether measured steps record live bytes over time (tuner.engine.timeline).
        self.timeline = timeline
        self.backend = backend
        self.settings = settings or ProbeSettings()
        self.headroom = headroom
        self.rank = rank
        self.parallel = workload.parallel
        # The ranks it is one of: the process group's (a fake world's too), else one process.
        self.mesh = self.parallel.mesh(_group_size())
        # The ranks of one tensor-parallel group compute one micro batch: the same samples.
        self.sample_rank = self.mesh.group_of(rank)
        self.budget_bytes = int((1 - headroom) * backend.capacity_bytes)
        self.model = _on_device(workload.model, backend.device)
        # What the step calls: the DDP wrapper, or the model sharded in place; wrapped
        # before the optimizer is built, so that FSDP's optimizer holds the shards.
        with backend.observe():
            self.module = parallelize(workload, self.parallel, backend.device)
        self.optimizer = workload.build_optimizer()
        # On the CPU a rank does not stop at the limit: one that did would leave the others
        # waiting in a collective (and cost a restart of every rank). It runs the whole
        # step and compares its peak afterwards, stopping only far past the limit, where
        # the verdict is plain and the host's memory is at stake.
        self.stop_at = DEFERRED_STOP if self.parallel.distributed and backend.kind == "cpu" else 1.0
        self._saved = TrainingState.capture(self.model, self.optimizer)
        self._between_micro_batches = 0
        # From here on what the probes allocate and keep (gradients, optimizer state, a
        # model's caches) is the workload's; the copies just made are not.
        backend.start_workload()

    def __enter__(self) -> Prober:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._saved.restore()
        self.backend.release_cached()

    def __call__(self, micro_batch_size: int, *, enforce_capacity: bool = True) -> ProbeResult:
        """Probe ``micro_batch_size``. ``enforce_capacity=False`` lets a backend that can
        (the CPU) measure a step larger than its capacity whole, to diagnose it."""
        started = time.perf_counter()
        # Each probe starts from an empty cache: a caching allocator (CUDA's) keeps the
        # segments of the last, larger probe reserved, and this probe's reserved peak would
        # be that one's (seen on an H200: every probe after one of 159 read 3.47 GiB). Its
        # own warm-up steps then build the steady state its measured steps are read in.
        self.backend.release_cached()
        non_torch = self.backend.non_torch_bytes()
        outcome: _StepsOutcome | None = None
        progress = _Progress()
        error: str | None = None
        try:
            outcome = self._run(micro_batch_size, progress, enforce_capacity)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            # Keep only the text: the exception's traceback holds the step's tensors.
            error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        finally:
            self._saved.restore()
        if outcome is None:
            self.backend.release_cached()
            return ProbeResult(
                micro_batch_size=micro_batch_size,
                fits=False,
                oom=True,
                non_torch_bytes=non_torch,
                steps_run=progress.steps,
                wall_time_s=time.perf_counter() - started,
                error=error,
            )
        reading = outcome.reading
        fits = fits_budget(reading, non_torch_bytes=non_torch, budget_bytes=self.budget_bytes)
        samples = micro_batch_size * self.settings.microbatches_per_step
        return ProbeResult(
            micro_batch_size=micro_batch_size,
            fits=fits,
            peak_allocated_bytes=reading.allocated_bytes,
            peak_reserved_bytes=reading.reserved_bytes,
            non_torch_bytes=non_torch,
            alloc_retries=reading.alloc_retries,
            phase_peaks_bytes=reading.phases,
            rank_peaks_bytes=[reading.reserved_bytes] if self.parallel.distributed else [],
            breakdown=outcome.breakdown,
            step_time_s=outcome.step_time_s,
            samples_per_second=samples / outcome.step_time_s if outcome.step_time_s > 0 else None,
            steps_run=progress.steps,
            wall_time_s=time.perf_counter() - started,
            timeline=reading.timeline,
        )

    def _run(self, size: int, progress: _Progress, enforce_capacity: bool) -> _StepsOutcome:
        batch = to_device(
            self.workload.sample_batch(size, rank=self.sample_rank), self.backend.device
        )
        self.module.train()
        scaler = self._new_scaler()
        track, stop = self.backend.track, self.stop_at
        if self.settings.warmup_steps:
            with track(self._resident(batch), enforce_capacity=enforce_capacity, stop_at=stop):
                for _ in range(self.settings.warmup_steps):
                    progress.steps += 1
                    self._step(batch, scaler)
        # The steps whose peak decides M*: nothing that changes what autograd allocates
        # (a dispatch mode, a hook) is active in them.
        with track(
            self._resident(batch), enforce_capacity=enforce_capacity, stop_at=stop
        ) as reading:
            measure = _Measure(reading, None)
            start = time.perf_counter()
            for _ in range(self.settings.measure_steps):
                progress.steps += 1
                self._step(batch, scaler, measure)
            self.backend.synchronize()
            step_time = (time.perf_counter() - start) / self.settings.measure_steps
        detail = (
            self._detail_step(batch, scaler, progress) if self.locate or self.timeline else None
        )
        reading.timeline = detail.reading.timeline if detail is not None else None
        breakdown = self._breakdown(measure, detail)
        if self.backend.tracking_slows_steps:
            # Tracking adds per-operator cost; time one step the way training runs it.
            start = time.perf_counter()
            progress.steps += 1
            self._step(batch, scaler)
            self.backend.synchronize()
            step_time = time.perf_counter() - start
        return _StepsOutcome(reading, breakdown, step_time)

    def _detail_step(
        self, batch: Batch, scaler: torch.amp.GradScaler | None, progress: _Progress
    ) -> _Measure | None:
        """One more step for what needs a mode or hooks: the timeline operator by operator
        (the CPU tracker is a dispatch mode) and the activations each block saves (forward
        and saved-tensor hooks). Its peak may differ from the measured step's where the
        mode makes autograd accumulate out of place; it never decides M*. None where it
        runs out of memory (the mode's copies can take a step that fits past the limit)."""
        try:
            with self.backend.track(
                self._resident(batch),
                enforce_capacity=True,
                stop_at=DEFERRED_STOP,
                timeline=self.timeline,
                detail=True,
            ) as reading:
                measure = _Measure(reading, BlockActivations(self.model) if self.locate else None)
                progress.steps += 1
                self._step(batch, scaler, measure)
                self.backend.synchronize()
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            return None
        return measure

    def _step(
        self, batch: Batch, scaler: torch.amp.GradScaler | None, measure: _Measure | None = None
    ) -> None:
        """One optimizer step over ``microbatches_per_step`` micro batches. With ``measure``,
        the peaks of its two phases are recorded apart: they grow differently with the
        batch, and the search fits each on its own. The accumulation phase's peak is also
        told apart into forward and backward, to say where the step's peak falls."""
        self._accumulate_step([batch] * self.settings.microbatches_per_step, scaler, measure)

    def _accumulate_step(
        self,
        batches: list[Batch],
        scaler: torch.amp.GradScaler | None,
        measure: _Measure | None = None,
        *,
        clock: list[float] | None = None,
    ) -> None:
        """One optimizer step over ``batches``. With ``clock``, the times (after the device
        has finished) at its start, after the last backward and after the optimizer step."""
        count = len(batches)
        sizes = [batch_size_of(batch) for batch in batches]
        if clock is not None:
            self.backend.synchronize()
            clock.append(time.perf_counter())
        self.optimizer.zero_grad(set_to_none=self.parallel.zero_grad_set_to_none)
        for index, batch in enumerate(batches):
            with sync_context(self.module, self.parallel, index, count):
                with self._autocast(), self._watch_forward(measure):
                    loss = self.workload.loss_fn(self.module, batch)
                self._end_part(measure, "forward")
                self._check_loss(loss)
                # Each micro batch weighs by its samples, as in the accumulator.
                loss = loss * (sizes[index] / sum(sizes))
                (scaler.scale(loss) if scaler is not None else loss).backward()
                del loss
            self._end_part(measure, "backward")
            if measure is not None and index == 0 and count > 1 and self.parallel.distributed:
                self._between_micro_batches = self._held_between_micro_batches(batches[0])
        if measure is not None:
            self.backend.end_phase(measure.reading, "accumulate")
        if clock is not None:
            self.backend.synchronize()
            clock.append(time.perf_counter())
        if scaler is not None:
            scaler.step(self.optimizer)
            scaler.update()
        else:
            self.optimizer.step()
        if clock is not None:
            self.backend.synchronize()
            clock.append(time.perf_counter())
        if measure is not None:
            self.backend.end_phase(measure.reading, "optimizer")
            measure.parts.phases["optimizer"] = measure.reading.phases["optimizer"]

    def time_split(self, split: list[int], *, steps: int = 2) -> float:
        """Seconds per optimizer step that accumulates over micro batches of the sizes in
        ``split``, untracked, as training runs it: one warm-up step, then the mean of
        ``steps``. The model, optimizer and RNG are put back afterwards."""
        sizes = sorted(set(split))
        samples = {
            size: to_device(
                self.workload.sample_batch(size, rank=self.sample_rank), self.backend.device
            )
            for size in sizes
        }
        batches = [samples[size] for size in split]
        self.module.train()
        scaler = self._new_scaler()
        try:
            self._accumulate_step(batches, scaler)
            self.backend.synchronize()
            start = time.perf_counter()
            for _ in range(steps):
                self._accumulate_step(batches, scaler)
            self.backend.synchronize()
            return (time.perf_counter() - start) / steps
        finally:
            self._saved.restore()

    def time_sizes(self, sizes: list[int], *, rounds: int) -> SpeedCurve:
        """Micro batches of each size in ``sizes`` timed as training runs them, untracked,
        in ``rounds`` interleaved rounds (a busy spell slows whichever size runs in it, and
        a size's rounds show by how much): each step accumulates over about as many samples
        as the largest size holds (``⌈largest / size⌉`` micro batches), then steps the
        optimizer. The micro batches and the optimizer step are timed apart, so that a
        plan of any batch is ``Σ m·s(m) + t_opt`` (:mod:`tuner.core.speeds`). One warm-up
        step per size first; the model, optimizer and RNG are put back after every step."""
        largest = max(sizes)
        steps = {
            size: [
                to_device(
                    self.workload.sample_batch(size, rank=self.sample_rank), self.backend.device
                )
            ]
            * -(-largest // size)
            for size in sizes
        }
        per_sample: dict[int, list[float]] = {size: [] for size in sizes}
        optimizer: list[float] = []
        self.module.train()
        scaler = self._new_scaler()
        try:
            for warm in [True] + [False] * rounds:
                for size in sizes:
                    clock: list[float] = []
                    self._accumulate_step(steps[size], scaler, clock=clock)
                    self._saved.restore()
                    if not warm:
                        start, accumulated, stepped = clock
                        per_sample[size].append((accumulated - start) / (size * len(steps[size])))
                        optimizer.append(stepped - accumulated)
        finally:
            self._saved.restore()
        return SpeedCurve(
            sizes=[
                TimedSize(micro_batch_size=m, seconds_per_sample=per_sample[m])
                for m in sorted(sizes)
            ],
            optimizer_seconds=min(optimizer),
        )

    def _watch_forward(self, measure: _Measure | None) -> AbstractContextManager[None]:
        if measure is None or measure.activations is None:
            return nullcontext()
        return measure.activations.forward()

    def _end_part(self, measure: _Measure | None, part: str) -> None:
        """Close the forward or backward part of a micro batch: its peak goes to
        ``measure.parts`` and, unchanged, into the reading's ``accumulate`` phase (the
        search's phases stay what they were)."""
        if measure is None:
            return
        self.backend.end_phase(measure.parts, part)
        measure.reading.add(measure.parts.phases[part], measure.parts.reserved_bytes, "accumulate")

    def _autocast(self) -> AbstractContextManager[Any]:
        return autocast(self.workload.precision, self.backend.device.type)

    def _new_scaler(self) -> torch.amp.GradScaler | None:
        if self.workload.precision != "fp16":
            return None
        return torch.amp.GradScaler(self.backend.device.type)

    def _check_loss(self, loss: object) -> None:
        # Every loss, not only the first: per-sample losses pass at micro batch 1.
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
            raise WorkloadError(
                f"loss_fn of {self.workload.name} must return a scalar tensor that requires "
                f"grad, got {type(loss).__name__}"
                + (f" of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else "")
            )

    def _resident(self, batch: Batch) -> Iterator[torch.Tensor]:
        yield from self.model.parameters()
        yield from self.model.buffers()
        # Tensors a module keeps as plain attributes (a mask, a table): alive all along.
        for module in self.model.modules():
            yield from (v for v in vars(module).values() if isinstance(v, torch.Tensor))
        yield from (p.grad for p in self.model.parameters() if p.grad is not None)
        yield from iter_tensors(dict(self.optimizer.state))
        yield from (tensor for _, tensor in batch_tensors(batch))

    def _held_between_micro_batches(self, batch: Batch) -> int:
        """Bytes the parallel wrapper holds after a micro batch's backward, before the next
        forward, beyond parameters, gradients, optimizer state and the batch: DDP's bucket
        copy of the gradients, or FSDP's unsharded gradients kept for accumulation. Garbage
        in reference cycles is collected first: what waits for the collector is not held."""
        self.backend.synchronize()
        gc.collect()
        known = storage_bytes(self._resident(batch))
        return max(0, self.backend.current_bytes() - known)

    def _breakdown(self, measure: _Measure, detail: _Measure | None = None) -> MemoryBreakdown:
        """From the measured step; the activations per block from the detail step."""
        reading = measure.reading
        params = storage_bytes(self.model.parameters())
        grads = storage_bytes(p.grad for p in self.model.parameters() if p.grad is not None)
        optimizer_state = storage_bytes(iter_tensors(dict(self.optimizer.state)))
        communication = self._between_micro_batches
        resident = params + grads + optimizer_state + communication
        return MemoryBreakdown(
            parameters_bytes=params,
            gradients_bytes=grads,
            optimizer_state_bytes=optimizer_state,
            communication_bytes=communication,
            collective_copies_bytes=reading.collective_copies_bytes,
            activations_bytes=max(0, reading.allocated_bytes - resident),
            allocator_cache_bytes=max(0, reading.reserved_bytes - reading.allocated_bytes),
            activations_by_block_bytes=(
                dict(detail.activations.bytes_by_block)
                if detail is not None and detail.activations
                else {}
            ),
            peak_phase=peak_phase(measure.parts),
        )


def _on_device(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``model`` moved to ``device``, or left alone when all of it is there already (a
    fake copy for a dry run cannot be moved: its tensors are subclasses that ``to`` swaps)."""
    tensors = [*model.parameters(), *model.buffers()]
    if all(
        t.device == device or (t.device.type == device.type and device.index is None)
        for t in tensors
    ):
        return model
    return model.to(device)


@dataclass
class _Progress:
    """Steps started so far, readable after an out-of-memory cut a probe short."""

    steps: int = 0


@dataclass
class _Measure:
    """What the measured steps record: the tracked reading, the peaks of forward, backward
    and the optimizer step apart, and the activations per block when locating."""

    reading: PeakReading
    activations: BlockActivations | None
    parts: PeakReading = field(default_factory=PeakReading)


@dataclass(frozen=True)
class _StepsOutcome:
    reading: PeakReading
    breakdown: MemoryBreakdown
    step_time_s: float


def _group_size() -> int:
    """The ranks of the current process group; 1 outside one."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
