"""A workload: one training step, described once by the user.

A target ``package.module:function`` names a factory that returns a :class:`Workload`.
Keyword options given on the command line (``-o precision=bf16``) are passed to it.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch
from torch import nn

from tuner.core.errors import WorkloadError
from tuner.core.parallel import Parallel
from tuner.core.targets import split_target
from tuner.engine.batching import Batch, batch_size_of

Precision = Literal["fp32", "bf16", "fp16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)

_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(precision: str, device_type: str) -> AbstractContextManager[Any]:
    """Autocast in the precision's dtype on ``device_type``; nothing for fp32."""
    dtype = _AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        return nullcontext()
    return torch.autocast(device_type, dtype=dtype)


OptimizerFactory = Callable[[Iterator[nn.Parameter]], torch.optim.Optimizer]
LossFn = Callable[[nn.Module, Batch], torch.Tensor]
# ``fully_shard`` with the spec's options bound; a workload's shard function calls it on
# each module that should be one FSDP unit, then on the root.
ShardFn = Callable[[nn.Module], Any]
ShardModelFn = Callable[[nn.Module, ShardFn], None]
# ``tp_plan(model, tp_mesh)`` calls ``parallelize_module`` on the parts to split.
TensorParallelPlanFn = Callable[[nn.Module, Any], None]


@dataclass(kw_only=True)
class Workload:
    """What we need to run a user's training step at any micro batch size.

    Attributes:
        model: the module to train.
        optimizer: an optimizer over ``model``'s parameters, or a factory called with
            ``model.parameters()`` once the model is on the probe device.
        make_batch: ``make_batch(n)`` returns ``n`` samples at the worst-case shape
            (the longest sequence, the largest image) so that a probe measures the peak.
        loss_fn: ``loss_fn(model, batch)`` runs forward and returns the scalar loss,
            averaged over the batch's loss units.
        loss_units: the number of units ``loss_fn`` averages over (tokens that are not
            padding, say); ``None`` means samples. Accumulation weights by it.
        precision: ``fp32``, or autocast in ``bf16``, or ``fp16`` with a GradScaler.
        activation_checkpointing: whether ``model`` recomputes activations in backward.
            The model applies it; the flag is part of the workload key.
        parallel: how training spreads over ranks (none, DDP or FSDP with the options
            that change memory); part of the workload key when not none.
        shard: for FSDP, ``shard(model, fully_shard)`` calls ``fully_shard`` on each
            unit (every transformer block, say), then on ``model``.
        tp_plan: for FSDP on a 2-D mesh, ``tp_plan(model, tp_mesh)`` calls
            ``parallelize_module`` on the parts tensor parallelism splits; a workload that
            gives one trains with ``Parallel(tp_plan="workload")`` under FSDP.
        variants: factory options whose values are alternatives that change memory and
            speed, e.g. ``{"checkpointing": [False, True], "precision": ["fp32", "bf16"]}``;
            ``tuner profile --explore`` profiles every combination and picks the fastest.
        memory_settings: settings that change memory but show nowhere in the modules, the
            parameters or the batch (the attention kernel: ``{"attn_implementation":
            "eager"}``); part of the workload key when given.

    Under a world size above 1, ``make_batch(n, rank=r)`` must draw rank r's samples.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer | OptimizerFactory
    make_batch: Callable[..., Batch]
    loss_fn: LossFn
    loss_units: Callable[[Batch], int] | None = None
    precision: Precision = "fp32"
    activation_checkpointing: bool = False
    parallel: Parallel = field(default_factory=Parallel)
    shard: ShardModelFn | None = None
    tp_plan: TensorParallelPlanFn | None = None
    variants: dict[str, list[object]] = field(default_factory=dict)
    memory_settings: dict[str, str] = field(default_factory=dict)
    name: str = ""
    target: str | None = field(default=None, compare=False)
    # The factory's keyword options, as load_workload received them: a rank process loads
    # the same workload from target and options.
    options: dict[str, object] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.model, nn.Module):
            raise WorkloadError(
                f"Workload.model must be a torch.nn.Module, got {type(self.model).__name__}"
            )
        if self.precision not in PRECISIONS:
            raise WorkloadError(
                f"unknown precision {self.precision!r}: use one of {', '.join(PRECISIONS)}"
            )
        if not (isinstance(self.optimizer, torch.optim.Optimizer) or callable(self.optimizer)):
            raise WorkloadError(
                "Workload.optimizer must be a torch.optim.Optimizer or a factory taking "
                "model.parameters()"
            )
        if not isinstance(self.parallel, Parallel):
            raise WorkloadError(
                "Workload.parallel must be a tuner Parallel, e.g. Parallel(mode='ddp'), "
                f"got {type(self.parallel).__name__}"
            )
        for name in ("make_batch", "loss_fn"):
            if not callable(getattr(self, name)):
                raise WorkloadError(f"Workload.{name} must be callable")
        for option, values in self.variants.items():
            if not option.isidentifier() or not isinstance(values, list) or len(values) < 2:
                raise WorkloadError(
                    f"Workload.variants[{option!r}] must list two or more values of the "
                    "factory option it names, e.g. variants={'checkpointing': [False, True]}"
                )
        if not self.name:
            self.name = type(self.model).__name__
        self.parallel = with_own_plan(self.parallel, self.tp_plan)

    def build_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer instance, creating it from the factory on first use."""
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            built = self.optimizer(self.model.parameters())
            if not isinstance(built, torch.optim.Optimizer):
                raise WorkloadError(
                    "the optimizer factory must return a torch.optim.Optimizer, "
                    f"got {type(built).__name__}"
                )
            self.optimizer = built
        return self.optimizer

    def sample_batch(self, size: int, *, rank: int = 0) -> Batch:
        """``make_batch(size)`` (with ``rank=`` on ranks above 0), checked to hold ``size``
        samples."""
        batch = self.make_batch(size, rank=rank) if rank else self.make_batch(size)
        try:
            actual = batch_size_of(batch)
        except ValueError as exc:
            raise WorkloadError(f"make_batch({size}) of {self.name}: {exc}") from None
        if actual != size:
            raise WorkloadError(
                f"make_batch({size}) of {self.name} returned {actual} samples: "
                "it must return exactly the number of samples asked for"
            )
        return batch


def with_own_plan(parallel: Parallel, tp_plan: TensorParallelPlanFn | None) -> Parallel:
    """FSDP of a workload that gives its own tensor-parallel plan names it, unless another
    plan is named: the plan is part of the workload key at every mesh shape, tp 1 included."""
    if tp_plan is not None and parallel.mode == "fsdp" and parallel.tp_plan is None:
        return parallel.model_copy(update={"tp_plan": "workload"})
    return parallel


def with_mesh(workload: Workload, tp: int | None) -> Parallel:
    """``workload.parallel`` with its own plan named (when it gives one) and ``--tp`` set."""
    from tuner.core.parallel import parse_parallel

    parallel = with_own_plan(workload.parallel, workload.tp_plan)
    if tp is None:
        return parallel
    if parallel.mode != "fsdp":
        raise WorkloadError(
            f"--tp {tp}: {workload.name} is not trained with FSDP; add --parallel fsdp"
        )
    return parse_parallel("fsdp", [f"tp={tp}"], parallel)


def parse_options(pairs: list[str]) -> dict[str, object]:
    """``["precision=bf16", "layers=4"]`` → ``{"precision": "bf16", "layers": 4}``.

    Values are read as JSON when they parse (numbers, true/false, null) and as strings
    otherwise.
    """
    options: dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.isidentifier():
            raise WorkloadError(f"option {pair!r} must look like name=value, e.g. precision=bf16")
        try:
            options[key] = json.loads(raw)
        except json.JSONDecodeError:
            options[key] = raw
    return options


def load_workload(target: str, options: Mapping[str, object] | None = None) -> Workload:
    """Import ``package.module:function`` and call it with ``options`` to get a Workload."""
    module_name, attr = split_target(target)
    # Like `python -m`, look in the current directory first: that is where a user's
    # training code lives when they run `tuner profile mymodule:workload`.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise WorkloadError(
            f"cannot import {module_name!r} for target {target!r}: {exc}; "
            "check the name and that the package is on PYTHONPATH"
        ) from None
    factory = getattr(module, attr, None)
    if factory is None:
        raise WorkloadError(f"module {module_name!r} has no attribute {attr!r} (target {target!r})")
    if isinstance(factory, Workload):
        workload = factory
    elif callable(factory):
        options = dict(options or {})
        _check_options(factory, options, target)
        workload = factory(**options)
    else:
        raise WorkloadError(f"{target!r} is neither a Workload nor a function returning one")
    if not isinstance(workload, Workload):
        raise WorkloadError(
            f"{target} returned {type(workload).__name__}, not a tuner.Workload: "
            "return Workload(model=..., optimizer=..., make_batch=..., loss_fn=...)"
        )
    workload.target = target
    workload.options = dict(options or {})
    return workload


def _check_options(factory: Callable[..., Any], options: dict[str, object], target: str) -> None:
    """Options the factory's signature does not take are refused in one line that lists
    the ones it takes (and the nearest, for a misspelling), before the factory runs."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return  # a callable without a signature: the factory checks its own options
    parameters = signature.parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    unknown = [name for name in options if name not in parameters]
    if unknown and not takes_any:
        valid = [
            name
            for name, p in parameters.items()
            if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        ]
        near = difflib.get_close_matches(unknown[0], valid, n=1)
        raise WorkloadError(
            f"options {options} do not fit {target}: {', '.join(map(repr, unknown))} "
            f"{'is not an option' if len(unknown) == 1 else 'are not options'} of it"
            + (f" (did you mean {near[0]}?)" if near else "")
            + f"; its options are {', '.join(valid) or 'none'}"
        )
    try:
        signature.bind(**options)
    except TypeError as exc:
        raise WorkloadError(f"options {options} do not fit {target}: {exc}") from None


def variant_options(workload: Workload) -> list[dict[str, object]]:
    """Every combination of the workload's declared variants, the options given to its
    factory held fixed (``-o precision=bf16`` explores the other options only); the
    combination the workload was loaded with comes first."""
    free = {
        option: values
        for option, values in workload.variants.items()
        if option not in workload.options
    }
    combinations: list[dict[str, object]] = [{}]
    for option, values in free.items():
        combinations = [{**done, option: value} for done in combinations for value in values]
    current = loaded_values(workload, list(free))
    combinations.sort(key=lambda combination: combination != current)
    return combinations


def factory_options(workload: Workload) -> list[str]:
    """The keyword options of the factory the workload was loaded from (``-o NAME=...``);
    none for a workload built in Python."""
    if workload.target is None:
        return []
    module_name, _, attr = workload.target.partition(":")
    factory = getattr(importlib.import_module(module_name), attr, None)
    if not callable(factory) or isinstance(factory, Workload):
        return []
    try:
        return list(inspect.signature(factory).parameters)
    except (TypeError, ValueError):
        return []


def loaded_values(workload: Workload, options: list[str]) -> dict[str, object]:
    """The values ``options`` had when the workload was loaded: given, or the factory's
    defaults."""
    defaults: dict[str, object] = {}
    if workload.target is not None:
        module_name, _, attr = workload.target.partition(":")
        factory = getattr(importlib.import_module(module_name), attr)
        if callable(factory) and not isinstance(factory, Workload):
            defaults = {
                name: parameter.default
                for name, parameter in inspect.signature(factory).parameters.items()
                if parameter.default is not inspect.Parameter.empty
            }
    return {option: workload.options.get(option, defaults.get(option)) for option in options}
