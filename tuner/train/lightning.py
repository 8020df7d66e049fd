"""Lightning: profile the training you already have, in one callback.

::

    from lightning.pytorch import Trainer
    from tuner.train.lightning import TunerCallback

    tuner = TunerCallback(global_batch_size=256)  # TUNER_URL, else a local database
    Trainer(callbacks=[tuner]).fit(module, datamodule=data)

Before fit, the callback profiles the module's own ``training_step`` and
``configure_optimizers`` on the worst-case batch of its own train dataloader (the longest
sample the dataset holds, through the dataloader's collate function: see
:mod:`tuner.train.own_training`), in the Trainer's precision, then sets ``batch_size``
where Lightning's ``BatchSizeFinder`` sets it (the module, its ``hparams``, the
datamodule) and ``trainer.accumulate_grad_batches`` to the answer's equal split
(Lightning runs micro batches of one size), so that

    batch_size × accumulate_grad_batches × data-parallel ranks = global_batch_size

exactly; where that split trains much slower than the recommended one (a global batch
without a good divisor, such as a prime), one warning names the nearest global batches
that split well.

The profile is stored in the service (or database) the client names and shared like any
other: the next fit with the same model, optimizer, precision and worst case asks and
probes nothing. The module's weights, gradients, train/eval flags and the RNG are as they
were; the optimizer the Trainer built is never touched (probes step one of their own from
``configure_optimizers``), and the Trainer's stage is put back. What probing cannot undo is
what ``training_step`` itself keeps (a counter of the samples it saw): the probes call it,
with ``self.trainer.sanity_checking`` True, as Lightning's own sanity check does, so a
step that counts can skip them (``if not self.trainer.sanity_checking``); one line says so
when tuning starts.

Under a multi-process strategy rank 0 profiles one process's step and every rank gets its
plan; the collectives' own buffers (DDP's gradient buckets) are not in that profile, so
leave them room with ``headroom``, or profile the step under DDP with ``tuner profile
--parallel ddp``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import GradientAccumulationScheduler
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.parsing import lightning_hasattr, lightning_setattr
from torch import nn

from tuner.core import plan as plans
from tuner.core.errors import BadInputError
from tuner.engine.batching import Batch
from tuner.engine.outcome import DEFAULT_HEADROOM
from tuner.engine.workload import Precision, Workload

if TYPE_CHECKING:
    from tuner.client import TunerClient

from tuner.train.own_training import (
    DEFAULT_SCAN,
    Tuned,
    WorstCase,
    check_device,
    check_global_batch_size,
    longest_sample,
    loss_of,
    memory_limit_bytes,
    plan_own_training,
    repeated_batches,
)

# Lightning's precision flags whose step the probe runs as it trains: autocast (and a
# GradScaler for fp16) for the mixed ones; the "true" ones and the rest through the
# Trainer's own precision plugin (its forward context and input conversion).
_MIXED: dict[str, Precision] = {"bf16-mixed": "bf16", "16-mixed": "fp16"}


class TunerCallback(pl.Callback):
    """Profile the module's own step on its own worst-case batch before fit, then set
    ``batch_size`` and ``accumulate_grad_batches`` so that the global batch is
    ``global_batch_size``.

    Args:
        global_batch_size: samples per optimizer step across every data-parallel rank.
        device: where to probe; by default where the module is (``cpu`` needs
            ``memory_limit``). Probing elsewhere would move the module, so it is refused.
        memory_limit: the memory the step must fit in, in bytes or as text (``"2GiB"``):
            needed on CPU, a smaller GPU emulated on CUDA.
        client: a :class:`tuner.client.TunerClient`, or its URL (``http(s)://…``,
            ``sqlite:///…``), or by default ``TUNER_URL``, and without it the local
            database ``tuner serve`` uses by default (said in one line). Under
            ``ddp_spawn``, which pickles callbacks into each rank, give the URL.
        lengths: one length per sample of the train dataset (``dataset["length"]``): the
            worst case is then the longest of them all, not of a scan.
        scan: how many samples a scan reads when no lengths are given.
        batch_size_attr: the attribute the train dataloader reads its batch size from.
        headroom: the fraction of memory kept free.
        policy: how the plan splits the batch (see :mod:`tuner.core.plan`).
        time_splits: time the fewest micro batches against more, smaller ones and keep
            the fastest when it wins by more than the timing's spread (one process only;
            a few optimizer steps of the whole batch: :mod:`tuner.train.fastest`).

    After fit starts, ``tuned`` holds the answer, the workload profiled and its worst case.
    """

    def __init__(
        self,
        *,
        global_batch_size: int,
        device: str | None = None,
        memory_limit: int | str | None = None,
        client: TunerClient | str | None = None,
        lengths: Sequence[int] | None = None,
        scan: int = DEFAULT_SCAN,
        batch_size_attr: str = "batch_size",
        headroom: float = DEFAULT_HEADROOM,
        policy: str = plans.DEFAULT_POLICY,
        time_splits: bool = False,
    ) -> None:
        self.global_batch_size = check_global_batch_size(global_batch_size)
        self.memory_limit = memory_limit_bytes(memory_limit)
        if policy not in plans.POLICIES:
            raise BadInputError(f"policy={policy!r}: use one of {', '.join(plans.POLICIES)}")
        self.device = device
        self.client = client
        self.lengths = lengths
        self.scan = scan
        self.batch_size_attr = batch_size_attr
        self.headroom = headroom
        self.policy = policy
        self.time_splits = time_splits
        self.tuned: Tuned | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.tune(trainer, pl_module)

    def tune(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> Tuned:
        """Profile (or ask), then set the batch size and the accumulation steps."""
        self._check(trainer, pl_module)
        device = check_device(self.device, pl_module.device)
        workload, worst_case = self._workload(trainer, pl_module)
        rank_zero_info(
            "TunerCallback: probing may run training_step on copies of the longest sample "
            "(trainer.sanity_checking is True meanwhile); the module, optimizer and RNG are "
            "put back, counters your training_step keeps are not"
        )
        with _probing(trainer):
            tuned = plan_own_training(
                workload,
                worst_case,
                global_batch_size=self.global_batch_size,
                data_parallel_size=data_parallel_size(trainer),
                device=device,
                memory_limit=self.memory_limit,
                client=self.client,
                headroom=self.headroom,
                policy=self.policy,
                time_splits=self.time_splits,
            )
        lightning_setattr(pl_module, self.batch_size_attr, tuned.micro_batch_size)
        trainer.accumulate_grad_batches = tuned.accumulation_steps
        # A dataloader built before (configure_optimizers may ask for the stepping batches)
        # has the old batch size: build it again, as BatchSizeFinder does.
        trainer.fit_loop._combined_loader = None
        self.tuned = tuned
        return tuned

    def _check(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not pl_module.automatic_optimization:
            raise BadInputError(
                "TunerCallback profiles automatic optimization (training_step returns the "
                "loss); this module steps its optimizers itself"
            )
        if not trainer.fit_loop._data_source.is_module():
            raise BadInputError(
                "TunerCallback sets the batch size where the dataloader reads it: define "
                "train_dataloader() in the LightningModule or a LightningDataModule instead "
                "of passing a DataLoader to fit()"
            )
        if any(isinstance(c, GradientAccumulationScheduler) for c in trainer.callbacks):  # type: ignore[attr-defined]
            raise BadInputError(
                "a GradientAccumulationScheduler sets accumulate_grad_batches each epoch, which "
                "would change the global batch TunerCallback keeps: use one or the other"
            )
        if not lightning_hasattr(pl_module, self.batch_size_attr):
            raise BadInputError(
                f"neither the module, its hparams nor the datamodule has "
                f"{self.batch_size_attr!r}: give the one train_dataloader() reads its batch "
                "size from (batch_size_attr=...)"
            )

    def _workload(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule
    ) -> tuple[Workload, WorstCase]:
        loader = trainer.fit_loop._data_source.dataloader()
        if not isinstance(loader, torch.utils.data.DataLoader):
            raise BadInputError(
                f"train_dataloader() returned {type(loader).__name__}: TunerCallback profiles "
                "one DataLoader"
            )
        worst_case = longest_sample(loader.dataset, lengths=self.lengths, scan=self.scan)
        plugin = trainer.precision_plugin
        precision = str(trainer.precision)

        def after(batch: Batch) -> Batch:
            # The batch as training_step receives it: the batch hooks, then the precision's
            # input conversion (to bf16 under "bf16-true").
            for owner in (getattr(trainer, "datamodule", None), pl_module):
                if owner is not None:
                    batch = owner.on_before_batch_transfer(batch, 0)
            for owner in (getattr(trainer, "datamodule", None), pl_module):
                if owner is not None:
                    batch = owner.on_after_batch_transfer(batch, 0)
            return plugin.convert_input(batch)

        def loss_fn(model: nn.Module, batch: Batch) -> torch.Tensor:
            module: Any = model
            context: AbstractContextManager[Any] = (
                nullcontext() if precision in _MIXED else plugin.forward_context()
            )
            with context, _without_logging(module):
                return loss_of(module.training_step(batch, 0), "training_step")

        collate: Any = loader.collate_fn
        workload = Workload(
            name=f"lightning-{type(pl_module).__name__}",
            model=pl_module,
            optimizer=lambda _parameters: _one_optimizer(pl_module.configure_optimizers()),
            make_batch=repeated_batches(collate, worst_case, after=after),
            loss_fn=loss_fn,
            precision=_MIXED.get(precision, "fp32"),
        )
        return workload, worst_case


def data_parallel_size(trainer: pl.Trainer) -> int:
    """The ranks that see different samples: what Lightning's distributed sampler splits
    the data over (1 on one device)."""
    kwargs = getattr(trainer.strategy, "distributed_sampler_kwargs", None) or {}
    return int(kwargs.get("num_replicas", 1))


def _one_optimizer(configured: object) -> torch.optim.Optimizer:
    """The optimizer in what ``configure_optimizers`` returned, in any of Lightning's forms
    (an optimizer, a list of one, ``([optimizer], [scheduler])``, a dict)."""
    found: object = configured
    if isinstance(found, Mapping):
        found = found.get("optimizer")
    if isinstance(found, list | tuple) and len(found) == 2 and isinstance(found[0], list):
        found = found[0]
    if isinstance(found, list | tuple) and len(found) == 1:
        found = found[0]
    if isinstance(found, Mapping):
        found = found.get("optimizer")
    found = getattr(found, "_optimizer", found)  # a LightningOptimizer wraps the real one
    if not isinstance(found, torch.optim.Optimizer):
        raise BadInputError(
            "TunerCallback profiles a module with one optimizer: configure_optimizers "
            f"returned {type(configured).__name__} ({configured!r:.80})"
        )
    return found


@contextmanager
def _probing(trainer: pl.Trainer) -> Iterator[None]:
    """The Trainer in its sanity-checking stage while probes run the module's step, so that
    a ``training_step`` that counts what it sees can skip probes as it skips Lightning's own
    sanity check (``if not self.trainer.sanity_checking: ...``); its stage put back after."""
    state = trainer.state
    stage = state.stage
    state.stage = RunningStage.SANITY_CHECKING
    try:
        yield
    finally:
        state.stage = stage


@contextmanager
def _without_logging(module: Any) -> Iterator[None]:
    """``self.log`` and ``self.log_dict`` do nothing while a probe runs the step: the loop
    that collects the logged values is not running, and probes are not training."""

    def ignore(*_args: object, **_kwargs: object) -> None:
        return None

    names = ("log", "log_dict")
    own = {name: module.__dict__[name] for name in names if name in module.__dict__}
    for name in names:
        object.__setattr__(module, name, ignore)
    try:
        yield
    finally:
        for name in names:
            if name in own:
                object.__setattr__(module, name, own[name])
            else:
                object.__delattr__(module, name)


__all__ = ["TunerCallback", "data_parallel_size"]
