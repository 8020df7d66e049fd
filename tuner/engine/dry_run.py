"""Predicted probes: the workload's training step run on fake tensors, which hold no memory.

A fake tensor (``torch._subclasses.fake_tensor``) has a shape, a dtype, a device and a
storage of the right size, and every operator computes only those: no data, no memory,
no kernel. The probe's own step (:class:`tuner.engine.probe.Prober`: warm-up, two micro
batches, the optimizer step, autocast) runs on a fake copy of the model and optimizer
under the CPU backend's tracker, which counts the bytes each storage would hold. The
tracker is a dispatch mode, and under any mode autograd accumulates some gradients out of
place (where a gradient arrives from two places), copies that the real probe's step, run
with no mode, does not make: a prediction is the real probe's peak to the byte where no
such copy is alive at the peak, and above it by the copies where one is (measured +6.8% at
micro batch 2 on Mamba). On a GPU the caching allocator's rounding, its cache and kernel
workspaces are not in it either. Either way a prediction only aims the search: the search
corrects for the difference from the probes that ran, and ``M*`` is always a probe that ran
(:mod:`tuner.engine.search.strategies`).

The step takes the real step's paths (:class:`HostValues`): the batch stays real on the
host, and what is computed from it alone runs on its values, because models branch on
them (transformers lets SDPA run its causal kernel only after reading that the attention
mask is all ones, and builds the mask for a fake one); and the few operators whose fake
kernels lay out their result unlike the device's are given the device's layout (a later
``reshape`` copies or not by it).

A dry run costs about one small real step per size and no device memory. It is used only
to aim the search; nothing it predicts is stored. Where the step cannot run on fake tensors
(a ``.item()`` in the loss on a value the model computed, a shape sized by such values, a
custom operator with no fake implementation), one line says so (:func:`refusal`), there is
no prediction and the search aims from probes alone. Across ranks the coordinator predicts
one process's step (:func:`dry_run_of_target`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    UnsupportedOperatorException,
    unset_fake_temporarily,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map_only

from tuner.core.errors import BadInputError
from tuner.core.parallel import Parallel
from tuner.core.results import DeviceInfo, ProbeResult, ProbeSettings
from tuner.engine.backends import Backend, CpuBackend, PeakReading
from tuner.engine.batching import Batch, map_tensors
from tuner.engine.probe import Prober
from tuner.engine.state import TrainingState
from tuner.engine.workload import Workload, load_workload

log = logging.getLogger(__name__)


# Operators whose device kernels return a contiguous result where torch's fake kernel keeps
# an input's layout: output index -> made contiguous. The layout decides later whether a
# ``reshape`` is a view or a copy, so a wrong one adds a copy the real step never makes.
# layer_norm_backward (CPU and CUDA: ``empty_like(X, LEGACY_CONTIGUOUS_MEMORY_FORMAT)``)
# after a transpose: Swin's windows, one activation-sized copy per block in backward.
_CONTIGUOUS_OUTPUTS: dict[Any, tuple[int, ...]] = {
    torch.ops.aten.native_layer_norm_backward.default: (0,),
}

# Operators whose real kernels return their input, where the fake kernel returns a new tensor
# (a fake world's tensor-parallel all-reduce: an activation-sized copy a block).
_RETURN_THEIR_INPUT = frozenset({torch.ops._c10d_functional.wait_tensor.default})

# While a coordinator builds the model on fake tensors (:class:`BuildValues`), host values
# up to this size are computed for real: a model reads values it computes while it is built,
# which a fake tensor has none of. Parameters larger than this stay fake; smaller ones cost
# the coordinator a few KiB.
_BUILD_VALUES_BYTES = 64 * 2**10


class HostValues(TorchDispatchMode):
    """Makes the step on fake tensors take the real step's paths. Sits between the tracker
    and the fake mode (a user mode above torch's fake mode), so the tracker counts what it
    returns.

    - An operator whose tensor arguments are all real host tensors (the batch and what is
      computed from it alone: ids, masks, labels), or that takes none (``ones``,
      ``arange``), runs for real where its result is on the host and no larger than
      ``max_bytes`` (the batch's largest tensor): a model reads such values to choose its
      path. transformers skips an all-ones attention mask and lets SDPA run its causal
      kernel (it takes a fake tensor for a trace and builds the mask: measured +24,576 B
      a sample on a two-layer Gemma), DeBERTa's loss picks the labelled rows with
      ``nonzero`` (which a fake tensor cannot answer), mBART's decoder checks the all-ones
      mask it makes itself with ``torch.ones``.
    - Operators of ``_CONTIGUOUS_OUTPUTS`` return the layout the device's kernel does, and
      those of ``_RETURN_THEIR_INPUT`` their input, as their real kernels do."""

    def __init__(self, max_bytes: int = 0) -> None:
        super().__init__()
        self.max_bytes = max_bytes

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        on_host = all(_on_host(t) for t in tensors)  # a factory (no tensor) too
        try:
            # The fake kernel first: it says how large the result would be, for nothing.
            out = func(*args, **kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException):
            if not on_host:
                raise
            # A value (``.item()``) or a shape read from the values (``nonzero``): of
            # host values, no larger than what they are read from.
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        if on_host and self._small_on_host(out):
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        if func in _RETURN_THEIR_INPUT:
            return args[0]
        contiguous = _CONTIGUOUS_OUTPUTS.get(func)
        if contiguous:
            outputs = list(out)
            for index in contiguous:
                if isinstance(outputs[index], torch.Tensor):
                    outputs[index] = outputs[index].contiguous()
            return type(out)(outputs)
        return out

    def noting_the_batch(self, resident: Iterable[torch.Tensor]) -> Iterator[torch.Tensor]:
        """``resident`` as it is, setting ``max_bytes`` to its largest real host tensor:
        the batch's (the model's tensors are fake)."""
        for tensor in resident:
            if _on_host(tensor):
                self.max_bytes = max(self.max_bytes, tensor.untyped_storage().nbytes())
            yield tensor

    def _small_on_host(self, out: Any) -> bool:
        leaves = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        return all(t.device.type == "cpu" for t in leaves) and (
            sum(t.untyped_storage().nbytes() for t in leaves) <= self.max_bytes
        )


class BuildValues(HostValues):
    """:class:`HostValues` while a model is built on fake tensors: host values up to
    ``max_bytes`` are computed for real (ConvNeXt's drop-path rates,
    ``torch.linspace(...).tolist()``), and a value read from a fake tensor is read from
    zeros. Only initialisers read fake values (torch's ``trunc_normal_`` samples until
    ``mask.any()`` is false: ViT's position embeddings), and the values of a fake model's
    weights are never used: a prediction needs their shapes."""

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        try:
            return super().__torch_dispatch__(func, types, args, kwargs)
        except DataDependentOutputException:
            # The same operator on zeros of the same shapes: expanded from one element,
            # so that no tensor's worth of memory is taken (``bool(mask.any())``).
            with unset_fake_temporarily():
                zeros = tree_map_only(
                    torch.Tensor,
                    lambda t: torch.zeros((), dtype=t.dtype).expand(t.shape),
                    (args, kwargs or {}),
                )
                return func(*zeros[0], **zeros[1])


# torch logs a fake kernel's failure with its traceback before re-raising it (FakeTensorMode's
# ``log.exception``: 22 lines on Mixtral's ``aten._grouped_mm``); the dry run says what
# stopped it in one line (:func:`refusal`), so while it runs those records are dropped.
_FAKE_TENSOR_LOGGER = "torch._subclasses.fake_tensor"


class _NoTracebacks(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.exc_info is None


@contextmanager
def quiet_fake_kernels() -> Iterator[None]:
    """Inside the block torch's fake tensors log no traceback of a kernel that failed (the
    exception still propagates, and the dry run says it in one line)."""
    logger = logging.getLogger(_FAKE_TENSOR_LOGGER)
    quiet = _NoTracebacks()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _on_host(tensor: torch.Tensor) -> bool:
    return type(tensor) is torch.Tensor and tensor.device.type == "cpu"


class FakeBackend(CpuBackend):
    """The CPU tracker over fake tensors on ``real``'s device, measured whole (no limit)."""

    # A fake step's time means nothing: no timed step is run after the measured one.
    tracking_slows_steps = False
    # Fake tensors allocate nothing: the tracker counts the bytes their storages would hold.
    counts_plain_steps = False

    def __init__(self, real: Backend, mode: FakeTensorMode) -> None:
        super().__init__(real.capacity_bytes)
        self.device = real.device
        self.real = real
        self.mode = mode

    def describe(self) -> DeviceInfo:
        return self.real.describe()

    def key_fields(self) -> dict[str, object]:
        return self.real.key_fields()

    def non_torch_bytes(self) -> int:
        return self.real.non_torch_bytes()

    @contextmanager
    def track(
        self,
        resident: Iterable[torch.Tensor],
        *,
        enforce_capacity: bool = True,
        stop_at: float = 1.0,
        timeline: bool = False,
        detail: bool = False,
    ) -> Iterator[PeakReading]:
        # A prediction past the limit is still a prediction; it draws no timeline.
        del enforce_capacity, timeline, detail
        values = HostValues()
        # Read as the tracker registers them, not kept: a list of the resident tensors would
        # keep the gradients that zero_grad lets go of alive through the step.
        resident = values.noting_the_batch(resident)
        with self.mode, values, super().track(resident, enforce_capacity=False) as reading:
            yield reading


class _DryProber(Prober):
    """A prober for fake tensors. Warmed up once: after the first prediction the state
    it puts back between predictions is the warmed one (optimizer moments, gradients), so
    each later prediction is one step, where a real probe must warm up every time (it
    gives the user's values back). fp16's loss scaler is left out (it reads whether the
    gradients are finite with ``.item()``, which fake tensors have no value for; its own
    memory is a few scalars)."""

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        outcome = super()._run(*args, **kwargs)
        if self.settings.warmup_steps:
            warmed = TrainingState.capture(self.model, self.optimizer)
            warmed.rng = self._saved.rng  # the user's random streams stay as they were
            self._saved = warmed
            self.settings = self.settings.model_copy(update={"warmup_steps": 0})
        return outcome

    def _new_scaler(self) -> torch.amp.GradScaler | None:
        return None


class DryRun:
    """``dry_run(m)``: the predicted probe of micro batch ``m`` (memoised), or ``None``
    when the step cannot run on fake tensors. Use as a context manager."""

    def __init__(
        self,
        workload: Workload,
        backend: Backend,
        *,
        headroom: float,
        mode: FakeTensorMode | None = None,
        measured_as: Callable[[Prober], Callable[[int], ProbeResult]] | None = None,
    ) -> None:
        """``measured_as``: how this process's probes are read (a fake world's count one
        collective in flight, :func:`tuner.engine.fake_group.with_one_collective_in_flight`);
        given, this process is rank 0 of a fake world, and the fake replica is wrapped as
        the workload's ranks are (FSDP's shards and gathers, the tensor plan's DTensors:
        torch's fake process group answers their collectives on fake tensors as on real)."""
        self._mode = mode or FakeTensorMode(allow_non_fake_inputs=True)
        self._predictions: dict[int, ProbeResult | None] = {}
        self._prober: Prober | None = None
        self._name = workload.name
        # The fake world a coordinator's dry run of a rank holds (dry_run_of_target).
        self._world = contextlib.ExitStack()
        if workload.parallel.distributed and measured_as is None:
            return  # ranks hold shards and buckets that one process's step does not show
        try:
            with quiet_fake_kernels():
                replica = fake_replica(workload, self._mode)
                # One warm-up step creates the optimizer's state, which is all a warm-up adds
                # to the peak on one process; the real probe's second warm-up changes nothing.
                settings = ProbeSettings(warmup_steps=1, measure_steps=1)
                self._prober = _DryProber(
                    replica, FakeBackend(backend, self._mode), headroom=headroom, settings=settings
                )
        except BadInputError:
            raise  # the settings cannot run at all (a plan refused): the probes' answer too
        except Exception as exc:  # any user code may refuse fake tensors: then no prediction
            log.warning(refusal(workload.name, exc))
        self._measure: Callable[[int], ProbeResult] | None = (
            None if self._prober is None or measured_as is None else measured_as(self._prober)
        )

    @classmethod
    def unavailable(cls) -> DryRun:
        """A dry run that predicts nothing."""
        dry_run = cls.__new__(cls)
        dry_run._predictions, dry_run._prober, dry_run._name = {}, None, ""
        dry_run._measure, dry_run._world = None, contextlib.ExitStack()
        return dry_run

    def __enter__(self) -> DryRun:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._prober is not None:
            self._prober.__exit__(*exc_info)
            self._prober = None
        self._world.close()

    @property
    def available(self) -> bool:
        return self._prober is not None

    def __call__(self, micro_batch_size: int) -> ProbeResult | None:
        if micro_batch_size in self._predictions:
            return self._predictions[micro_batch_size]
        prediction = None
        if self._prober is not None:
            try:
                with quiet_fake_kernels():
                    prediction = (self._measure or self._prober)(micro_batch_size)
            except BadInputError:
                raise  # the settings cannot run at all (a plan refused): the probes' answer too
            except Exception as exc:
                log.warning(refusal(self._name, exc, micro_batch_size))
                self.__exit__(None, None, None)
        self._predictions[micro_batch_size] = prediction
        return prediction


def dry_run_of_target(
    target: str,
    options: Mapping[str, Any],
    *,
    capacity_bytes: int,
    headroom: float,
    ranks: tuple[Parallel, int] | None = None,
) -> DryRun:
    """For the coordinator of ranks (:mod:`tuner.engine.launch`), which holds no model: the
    workload loaded on fake tensors (built under the fake mode, so that not even a factory
    that puts its model on a GPU takes memory here), one process's step of it on the CPU.
    A rank's peak differs from it by what the wrapper holds (DDP's buckets, FSDP's shards
    and gathers, about constant in the batch) and by the device; the search calibrates the
    predictions on the ranks' probes, as it does a GPU's.

    With ``ranks`` (the parallel settings and the world size), the step predicted is rank
    0's: the fake copy is wrapped as the ranks' models are, in a fake world of that size
    held by the dry run (:mod:`tuner.engine.fake_world`), and one collective is counted in
    flight as a fake world's probes count it. FSDP runs so; DDP does not (its reducer's
    communication hook asserts on a fake result in C++)."""
    from tuner.engine.fake_group import fake_process_group, with_one_collective_in_flight

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with quiet_fake_kernels(), mode, BuildValues(_BUILD_VALUES_BYTES):
            workload = load_workload(target, dict(options))
        if ranks is None:
            workload = dataclasses.replace(workload, parallel=Parallel(), shard=None)
        else:
            workload = dataclasses.replace(workload, parallel=ranks[0])
    except Exception as exc:
        log.warning(refusal(target, exc))
        return DryRun.unavailable()
    if ranks is None:
        return DryRun(workload, CpuBackend(capacity_bytes), headroom=headroom, mode=mode)
    world = contextlib.ExitStack()
    world.enter_context(fake_process_group(ranks[1]))
    dry_run = DryRun(
        workload,
        CpuBackend(capacity_bytes),
        headroom=headroom,
        mode=mode,
        measured_as=with_one_collective_in_flight,
    )
    dry_run._world = world
    return dry_run


def fake_replica(workload: Workload, mode: FakeTensorMode) -> Workload:
    """``workload`` over a fake copy of its model: parameters and buffers become fake
    tensors of the same shape, dtype and device (the copy of the modules shares nothing
    with the user's), the optimizer is rebuilt over them, and batches are made fake."""
    fakes: dict[int, torch.Tensor] = {}
    for tensor in [*workload.model.parameters(), *workload.model.buffers()]:
        # A model built under ``mode`` (dry_run_of_target) is fake already.
        fake: torch.Tensor = tensor if isinstance(tensor, FakeTensor) else mode.from_tensor(tensor)
        if isinstance(tensor, nn.Parameter):
            fake = nn.Parameter(fake, requires_grad=tensor.requires_grad)
        fakes[id(tensor)] = fake
    memo: dict[int, Any] = dict(fakes)
    # Tensors kept as plain attributes (a mask, a table) are faked too: a real copy of them
    # would hold device memory beside the probes for as long as the dry run lives.
    for module in workload.model.modules():
        for value in vars(module).values():
            if isinstance(value, torch.Tensor) and id(value) not in memo:
                memo[id(value)] = (
                    value if isinstance(value, FakeTensor) else mode.from_tensor(value)
                )
    # deepcopy's memo maps each real tensor to its fake: no real tensor is copied.
    model = copy.deepcopy(workload.model, memo)
    return dataclasses.replace(
        workload,
        model=model,
        optimizer=_replica_optimizer(workload.optimizer, fakes),
        make_batch=_fake_batches(workload.make_batch, mode),
    )


def _replica_optimizer(
    optimizer: torch.optim.Optimizer | Callable[..., torch.optim.Optimizer],
    fakes: dict[int, torch.Tensor],
) -> Callable[..., torch.optim.Optimizer]:
    """A factory: the user's own, or one that builds the user's optimizer class with its
    groups and options over the fake parameters."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    groups = [
        {
            **{k: v for k, v in group.items() if k != "params"},
            "params": [fakes[id(p)] for p in group["params"]],
        }
        for group in optimizer.param_groups
    ]
    cls = type(optimizer)
    # Every group carries all its options; the constructor's own arguments are passed too
    # for one that requires some (``defaults`` may hold more keys than it takes).
    accepted = inspect.signature(cls.__init__).parameters
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    return lambda _parameters: cls(groups, **defaults)


def _fake_batches(make_batch: Callable[..., Batch], mode: FakeTensorMode) -> Callable[..., Batch]:
    """Batches whose host tensors stay real (their values choose the model's paths,
    :class:`HostValues`; they are small and the real probe makes them too) and whose
    device tensors are made fake."""

    def make(size: int, **kwargs: Any) -> Batch:
        return map_tensors(
            make_batch(size, **kwargs),
            lambda t: t if _on_host(t) else mode.from_tensor(t),
        )

    return make


def refusal(name: str, exc: BaseException, micro_batch_size: int | None = None) -> str:
    """The one line that says what the dry run of ``name`` could not run, and that the
    search goes on without predictions (its first probe unaimed)."""
    where = "" if micro_batch_size is None else f" at micro batch {micro_batch_size}"
    func = getattr(exc, "func", None)
    if isinstance(exc, DataDependentOutputException):
        why = f"{func} reads a value of a tensor computed from the model (.item(), a branch)"
    elif isinstance(exc, DynamicOutputShapeException):
        why = f"{func} sizes its result by the values of a tensor computed from the model"
    elif isinstance(exc, UnsupportedOperatorException):
        why = f"{func} has no fake-tensor implementation"
    else:
        why = f"{type(exc).__name__}: {_first_line(exc)}"
    return (
        f"dry run of {name} stopped{where}: {why}, which fake tensors cannot run; "
        "the search goes on without predictions"
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
