"""Stable keys for what changes memory: the workload key and the device key.

A key is the SHA-256 of a canonical JSON document, so the same inputs give the same key
in any process, and the document itself says what the key covers. Parameter values,
learning rates and device placement do not change memory and are left out.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from tuner.core.errors import WorkloadError
from tuner.engine.backends.base import Backend
from tuner.engine.batching import batch_tensors
from tuner.engine.workload import Workload

KEY_LENGTH = 24


def stable_key(document: Mapping[str, Any]) -> str:
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:KEY_LENGTH]


def workload_document(workload: Workload, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Module tree, tensors, input signature, optimizer settings, precision, checkpointing,
    the settings that change memory outside them (``memory_settings``)."""
    return {
        "modules": _module_tree(workload.model),
        "parameters": [
            [name, list(p.shape), str(p.dtype), p.requires_grad]
            for name, p in workload.model.named_parameters(remove_duplicate=False)
        ],
        "buffers": [
            [name, list(b.shape), str(b.dtype)]
            for name, b in workload.model.named_buffers(remove_duplicate=False)
        ],
        "inputs": input_signature(workload),
        "optimizer": optimizer_signature(optimizer, workload.model),
        "precision": workload.precision,
        "activation_checkpointing": workload.activation_checkpointing,
        # Only when given, so that keys of workloads without such settings stay what they were.
        **(
            {"settings": dict(sorted(workload.memory_settings.items()))}
            if workload.memory_settings
            else {}
        ),
        # Only when parallel, so that keys of one-process workloads stay what they were.
        **(
            {"parallel": workload.parallel.memory_fields()} if workload.parallel.distributed else {}
        ),
    }


def workload_key(workload: Workload, optimizer: torch.optim.Optimizer) -> str:
    return stable_key(workload_document(workload, optimizer))


def device_key(backend: Backend) -> str:
    return stable_key(backend.key_fields())


LENGTH = "S"  # what a value that changes with the sequence length is written as


def length_family_key(documents: Sequence[Mapping[str, Any]]) -> str:
    """The key shared by one workload built at different sequence lengths.

    ``documents`` are :func:`workload_document` of the workload at two or more lengths.
    Every value that differs between them (the length in the input shapes, a position
    table's rows, a module's ``extra_repr`` that names the length) is written ``"S"``;
    every other value stays, so a model of another width or depth gets another key. The
    same workload at 256 and 512 and later at 1024 and 2048 gets the same key.
    """
    if len(documents) < 2:
        raise WorkloadError("a length family needs the workload at two or more lengths")
    merged = _merge_lengths(list(documents), "")
    if stable_key(merged) == stable_key(documents[0]):
        raise WorkloadError(
            "the workload is the same at every seq_len: the factory must build its batches "
            "(and model) for the seq_len it is given"
        )
    return stable_key({"family": "seq_len", "workload": merged})


def _merge_lengths(values: list[Any], path: str) -> Any:
    """``values`` (one per length) merged: equal leaves kept, differing ones ``"S"``."""
    first = values[0]
    if isinstance(first, Mapping):
        if any(not isinstance(v, Mapping) or v.keys() != first.keys() for v in values):
            raise _structure_changes(path, "its keys differ")
        return {key: _merge_lengths([v[key] for v in values], f"{path}/{key}") for key in first}
    if isinstance(first, list | tuple):
        if any(not isinstance(v, list | tuple) or len(v) != len(first) for v in values):
            raise _structure_changes(path, "its length differs")
        return [
            _merge_lengths([v[i] for v in values], _item_path(path, first, i))
            for i in range(len(first))
        ]
    if any(isinstance(v, Mapping | list | tuple) for v in values):
        raise _structure_changes(path, "a value becomes a list or a mapping")
    return first if all(v == first for v in values[1:]) else LENGTH


def _item_path(path: str, items: Sequence[Any], index: int) -> str:
    # Rows of modules, parameters and inputs start with their name: say it, not its index.
    item = items[index]
    named = isinstance(item, list | tuple) and item and isinstance(item[0], str)
    return f"{path}/{item[0] if named else index}"


def _structure_changes(path: str, what: str) -> WorkloadError:
    return WorkloadError(
        f"the model's structure changes with seq_len: at {path or 'the top'} {what}; "
        "profile each length on its own (-o seq_len=N)"
    )


def _module_tree(model: nn.Module) -> list[list[str]]:
    # extra_repr carries the configuration (features, kernel sizes, eps, ...).
    return [
        [name, _class_name(module), module.extra_repr()]
        for name, module in model.named_modules(remove_duplicate=False)
    ]


def _class_name(module: nn.Module) -> str:
    # fully_shard swaps a module's class for a subclass of (FSDPModule, the class); the
    # key names the user's class, so it is the same before and after sharding.
    cls = type(module)
    if cls.__name__.startswith("FSDP") and len(cls.__bases__) == 2:
        from torch.distributed.fsdp import FSDPModule

        if cls.__bases__[0] is FSDPModule:
            cls = cls.__bases__[1]
    return f"{cls.__module__}.{cls.__qualname__}"


def input_signature(workload: Workload) -> list[list[Any]]:
    """Shape and dtype of every batch tensor, with the sample dimension written ``"B"``.

    Dimensions that differ between ``make_batch(1)`` and ``make_batch(2)`` scale with the
    batch; every other dimension (sequence length, image size) is part of the key.
    """
    one = dict(batch_tensors(workload.sample_batch(1)))
    two = dict(batch_tensors(workload.sample_batch(2)))
    signature: list[list[Any]] = []
    for path, tensor in one.items():
        other = two.get(path)
        shape: list[int | str] = [
            "B"
            if other is not None and other.dim() == tensor.dim() and other.shape[i] != size
            else size
            for i, size in enumerate(tensor.shape)
        ]
        signature.append([path, shape, str(tensor.dtype)])
    return signature


def optimizer_signature(optimizer: torch.optim.Optimizer, model: nn.Module) -> dict[str, Any]:
    """Class, per-group settings that shape its state, and which parameters it updates.

    Flags (foreach, fused, amsgrad, ...) are kept as they are. Numbers are kept only as
    zero or non-zero: SGD keeps a momentum buffer when momentum ≠ 0, while the learning
    rate's value never changes memory.
    """
    names = {id(p): name for name, p in model.named_parameters(remove_duplicate=False)}
    groups = []
    for group in optimizer.param_groups:
        # Only the optimizer's own settings: LR schedulers add keys (initial_lr, max_lr,
        # ...) to the groups once training starts, and those never change memory.
        settings = {
            k: _memory_relevant(v) for k, v in sorted(group.items()) if k in optimizer.defaults
        }
        params = [names.get(id(p), f"<not in model: {list(p.shape)}>") for p in group["params"]]
        groups.append({"settings": settings, "params": params})
    cls = type(optimizer)
    return {"class": f"{cls.__module__}.{cls.__qualname__}", "groups": groups}


def _memory_relevant(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, int | float):
        return "zero" if value == 0 else "nonzero"
    if isinstance(value, list | tuple):
        return [_memory_relevant(v) for v in value]
    return type(value).__name__
