"""The Hugging Face ``Trainer``: profile the training you already have, in one call.

::

    from transformers import Trainer
    from tuner.train.huggingface import tune_trainer

    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=collator)
    tune_trainer(trainer, global_batch_size=256)  # TUNER_URL, else a local database
    trainer.train()

``tune_trainer`` profiles the Trainer's own step: its model, the optimizer its arguments
name (``optim``, learning-rate and weight-decay groups as ``create_optimizer`` builds
them, or the one passed as ``optimizers=``), its ``compute_loss`` (a subclass's too), its
precision (``bf16``, ``fp16``) and activation checkpointing, on the worst-case batch of
its own train dataset through its own data collator (the longest sample, see
:mod:`tuner.train.own_training`; sampling by length, the dataset's length column names
it exactly). Then it sets ``per_device_train_batch_size`` and
``gradient_accumulation_steps`` to the answer's equal split (the Trainer runs micro
batches of one size), so that

    per_device_train_batch_size × gradient_accumulation_steps × data-parallel ranks
        = global_batch_size

exactly; where that split trains much slower than the recommended one (a global batch
without a good divisor), one warning names the nearest global batches that split well.

The profile is stored in the service (or database) the client names and shared like any
other. The model's weights, gradients, train/eval flags and checkpointing, and the RNG,
are as they were; the Trainer's optimizer, when it has one, keeps its state.

Under ``torchrun`` every rank calls it; rank 0 profiles one process's step and every rank
gets its plan (DDP's gradient buckets are not in that profile: leave them ``headroom``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
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
    check_device,
    check_global_batch_size,
    longest_sample,
    loss_of,
    memory_limit_bytes,
    plan_own_training,
    repeated_batches,
)


def tune_trainer(
    trainer: Any,
    *,
    global_batch_size: int,
    device: str | None = None,
    memory_limit: int | str | None = None,
    client: TunerClient | str | None = None,
    lengths: Sequence[int] | None = None,
    scan: int = DEFAULT_SCAN,
    headroom: float = DEFAULT_HEADROOM,
    policy: str = plans.DEFAULT_POLICY,
    time_splits: bool = False,
) -> Tuned:
    """Profile ``trainer``'s own step on its worst-case batch (or use the stored profile)
    and set its micro batch and accumulation steps for ``global_batch_size``.

    ``device`` defaults to the Trainer's (``cpu`` needs ``memory_limit``: bytes, or text
    such as ``"2GiB"``); ``client`` (a ``TunerClient`` or its URL) to one from
    ``TUNER_URL``, else the local database ``tuner serve`` uses by default; ``lengths``
    (one per sample) finds the longest sample exactly, else ``scan`` samples are read.
    ``time_splits`` times the fewest micro batches against more, smaller ones and keeps the
    fastest when it wins by more than the timing's spread (:mod:`tuner.train.fastest`).
    """
    global_batch_size = check_global_batch_size(global_batch_size)
    limit = memory_limit_bytes(memory_limit)
    args = trainer.args
    if trainer.train_dataset is None:
        raise BadInputError("the Trainer has no train_dataset: there is no training to profile")
    if args.n_gpu > 1:
        raise BadInputError(
            f"the Trainer runs torch.nn.DataParallel over {args.n_gpu} GPUs in one process: "
            "launch one process per GPU with torchrun (DDP), or make one GPU visible"
        )
    model: nn.Module = trainer.model
    probe_device = check_device(device, next(model.parameters()).device)
    dataset, collate = _training_data(trainer)
    if lengths is None:
        lengths = _length_column(trainer, dataset)
    worst = longest_sample(dataset, lengths=lengths, scan=scan)
    checkpointing = bool(
        getattr(args, "activation_checkpointing", False)
        or getattr(args, "gradient_checkpointing", False)
    )

    def loss_fn(module: nn.Module, batch: Batch) -> torch.Tensor:
        with trainer.compute_loss_context_manager():
            return loss_of(trainer.compute_loss(module, batch), "compute_loss")

    workload = Workload(
        name=f"hf-trainer-{type(model).__name__}",
        model=model,
        optimizer=trainer.optimizer or (lambda _parameters: _optimizer_of(trainer, model)),
        make_batch=repeated_batches(collate, worst),
        loss_fn=loss_fn,
        precision=_precision(args),
        activation_checkpointing=checkpointing,
    )
    with _checkpointing(model, args if checkpointing else None):
        tuned = plan_own_training(
            workload,
            worst,
            global_batch_size=global_batch_size,
            data_parallel_size=data_parallel_size(trainer),
            device=probe_device,
            memory_limit=limit,
            client=client,
            headroom=headroom,
            policy=policy,
            time_splits=time_splits,
        )
    args.per_device_train_batch_size = tuned.micro_batch_size
    args.gradient_accumulation_steps = tuned.accumulation_steps
    # The Trainer builds its dataloader from this copy, taken when it was made.
    trainer._train_batch_size = args.train_batch_size
    return tuned


def data_parallel_size(trainer: Any) -> int:
    """The ranks that see different samples: the world over tensor, context and sequence
    parallelism, as ``Trainer.get_total_train_batch_size`` counts them."""
    size = int(trainer.args.world_size)
    for name in ("get_tp_size", "get_cp_size", "get_sp_size"):
        degree = getattr(trainer, name, None)
        if callable(degree):
            size //= int(degree())
    return max(1, size)


def _training_data(trainer: Any) -> tuple[Any, Any]:
    """The train dataset and the collator as the Trainer's dataloader holds them: columns
    the model's forward does not take removed (from a ``datasets.Dataset``, or by the
    collator around any other)."""
    dataset, collate = trainer.train_dataset, trainer.data_collator
    if not trainer.args.remove_unused_columns:
        return dataset, collate
    if hasattr(dataset, "column_names") and hasattr(dataset, "remove_columns"):
        return trainer._remove_unused_columns(dataset, description="training"), collate
    return dataset, trainer._get_collator_with_removed_columns(collate, description="training")


def _length_column(trainer: Any, dataset: Any) -> list[int] | None:
    """When the Trainer samples by length (``train_sampling_strategy="group_by_length"`` or
    ``"batch_rebalance"``, ``group_by_length=True`` before transformers 5), the dataset's
    own length column, which it reads too."""
    args = trainer.args
    column = getattr(args, "length_column_name", None)
    by_length = getattr(args, "group_by_length", False) or getattr(
        args, "train_sampling_strategy", None
    ) in ("group_by_length", "batch_rebalance")
    if not by_length or column is None:
        return None
    original = trainer.train_dataset
    names = getattr(original, "column_names", None)
    if not names or column not in names:
        return None
    lengths = original[column]
    if len(lengths) != len(dataset):
        return None
    return [int(length) for length in lengths]


def _precision(args: Any) -> Precision:
    if getattr(args, "bf16", False):
        return "bf16"
    if getattr(args, "fp16", False):
        return "fp16"
    return "fp32"


def _optimizer_of(trainer: Any, model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer ``Trainer.create_optimizer`` would build, without building the
    Trainer's own: the class and settings its arguments name, parameters with and without
    weight decay in groups of their own."""
    if trainer.optimizer_cls_and_kwargs is not None:
        cls, kwargs = trainer.optimizer_cls_and_kwargs
    else:
        cls, kwargs = trainer.get_optimizer_cls_and_kwargs(trainer.args, model)
    decay = set(trainer.get_decay_parameter_names(model))
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    weight_decay = trainer.args.weight_decay
    groups = [
        {"params": [p for n, p in trained if n in decay], "weight_decay": weight_decay},
        {"params": [p for n, p in trained if n not in decay], "weight_decay": 0.0},
    ]
    optimizer: torch.optim.Optimizer = cls([g for g in groups if g["params"]], **kwargs)
    return optimizer


@contextmanager
def _checkpointing(model: Any, args: Any) -> Iterator[None]:
    """Activation checkpointing on while probing when the arguments ask for it (the Trainer
    turns it on when training starts, with the same options), and off again afterwards if
    it was off."""
    if args is None or _checkpointing_on(model):
        yield
        return
    options = dict(
        getattr(args, "activation_checkpointing_kwargs", None)
        or getattr(args, "gradient_checkpointing_kwargs", None)
        or {}
    )
    every = options.pop("every_n_layers", 1)
    offload = options.pop("offload", False)
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs=options or None, every_n_layers=every, offload=offload
        )
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options or None)
    try:
        yield
    finally:
        if hasattr(model, "activation_checkpointing_disable"):
            model.activation_checkpointing_disable()
        else:
            model.gradient_checkpointing_disable()


def _checkpointing_on(model: Any) -> bool:
    # Read what the property reads: the older name warns on newer releases.
    return any(getattr(module, "gradient_checkpointing", False) for module in model.modules())


__all__ = ["data_parallel_size", "tune_trainer"]
