"""tuner.engine.fingerprint: keys change with what changes memory, and only with that."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from tests.helpers import run_python
from tests.workloads import first_layer, tiny
from tuner.engine.backends import CpuBackend, make_backend
from tuner.engine.fingerprint import device_key, input_signature, workload_document, workload_key
from tuner.engine.profiler import profile_workload
from tuner.engine.workload import Workload, load_workload


def key_of(workload: Workload) -> str:
    return workload_key(workload, workload.build_optimizer())


def adamw(**options: object) -> Callable[..., torch.optim.Optimizer]:
    return lambda params: torch.optim.AdamW(params, lr=1e-3, **options)  # type: ignore[arg-type]


def sgd(momentum: float, lr: float = 0.1) -> Callable[..., torch.optim.Optimizer]:
    return lambda params: torch.optim.SGD(params, lr=lr, momentum=momentum)


def test_key_is_stable_and_short() -> None:
    first, second = key_of(tiny()), key_of(tiny())
    assert first == second
    assert len(first) == 24
    int(first, 16)  # hexadecimal


@pytest.mark.slow
def test_same_workload_gives_the_same_key_in_another_process() -> None:
    # The GPT example has a dict batch, tied weights and padding: the richest document.
    options = {"vocab": 64, "seq_len": 8, "dim": 16, "layers": 1, "heads": 2}
    code = (
        "from tuner.engine.workload import load_workload\n"
        "from tuner.engine.fingerprint import workload_key\n"
        f"w = load_workload('examples.gpt:workload', {options!r})\n"
        "print(workload_key(w, w.build_optimizer()))\n"
    )
    child = run_python(code)
    assert child.returncode == 0, child.stderr
    here = load_workload("examples.gpt:workload", options)
    assert child.stdout.strip() == key_of(here)


def _frozen_first_layer() -> Workload:
    workload = tiny()
    first_layer(workload).requires_grad_(False)
    return workload


def _double_first_layer() -> Workload:
    workload = tiny()
    first_layer(workload).to(torch.float64)
    return workload


MEMORY_RELEVANT: dict[str, tuple[Callable[[], Workload], Callable[[], Workload]]] = {
    "layer width": (lambda: tiny(width=16), lambda: tiny(width=32)),
    "parameter dtype": (tiny, _double_first_layer),
    "sequence length in make_batch": (lambda: tiny(seq_len=4), lambda: tiny(seq_len=5)),
    "optimizer class": (lambda: tiny(optimizer=adamw()), lambda: tiny(optimizer=sgd(0.9))),
    "SGD momentum zero or not": (
        lambda: tiny(optimizer=sgd(0.0)),
        lambda: tiny(optimizer=sgd(0.9)),
    ),
    "AdamW foreach flag": (
        lambda: tiny(optimizer=adamw(foreach=False)),
        lambda: tiny(optimizer=adamw(foreach=True)),
    ),
    "AdamW amsgrad": (lambda: tiny(optimizer=adamw()), lambda: tiny(optimizer=adamw(amsgrad=True))),
    "precision bf16": (tiny, lambda: tiny(precision="bf16")),
    "precision fp16": (lambda: tiny(precision="bf16"), lambda: tiny(precision="fp16")),
    "activation checkpointing": (tiny, lambda: tiny(checkpointing=True)),
    "frozen layer": (tiny, _frozen_first_layer),
}


@pytest.mark.parametrize("change", sorted(MEMORY_RELEVANT))
def test_memory_relevant_change_gives_another_key(change: str) -> None:
    before, after = MEMORY_RELEVANT[change]
    assert key_of(before()) != key_of(after())


IRRELEVANT: dict[str, tuple[Callable[[], Workload], Callable[[], Workload]]] = {
    "learning rate": (
        lambda: tiny(optimizer=sgd(0.9, lr=0.1)),
        lambda: tiny(optimizer=sgd(0.9, lr=0.001)),
    ),
    "SGD momentum value": (lambda: tiny(optimizer=sgd(0.5)), lambda: tiny(optimizer=sgd(0.99))),
    "parameter values (seed)": (lambda: tiny(seed=0), lambda: tiny(seed=1234)),
}


@pytest.mark.parametrize("change", sorted(IRRELEVANT))
def test_irrelevant_change_keeps_the_key(change: str) -> None:
    before, after = IRRELEVANT[change]
    first, second = before(), after()
    if change.startswith("parameter values"):
        # The change is real: the weights differ.
        assert not torch.equal(first_layer(first).weight, first_layer(second).weight)
    assert key_of(first) == key_of(second)


def test_key_does_not_depend_on_the_batch_size_asked_for() -> None:
    # The sample dimension is written "B"; the sequence length is part of the key.
    signature = input_signature(tiny(seq_len=6))
    assert signature == [
        ["[0]", ["B", 6, 8], "torch.float32"],
        ["[1]", ["B", 6], "torch.int64"],
    ]
    small = profile_workload(tiny(), CpuBackend(10 * 2**20), size_cap=2)
    large = profile_workload(tiny(), CpuBackend(10 * 2**20), size_cap=5)
    assert small.max_micro_batch_size == 2
    assert large.max_micro_batch_size == 5
    assert small.workload_key == large.workload_key == key_of(tiny())


def test_document_covers_parameters_buffers_and_optimizer_groups() -> None:
    workload = load_workload("examples.cnn:workload", {"width": 4, "image_size": 8})
    document = workload_document(workload, workload.build_optimizer())
    parameter_names = [entry[0] for entry in document["parameters"]]
    assert "head.weight" in parameter_names
    buffer_names = [entry[0] for entry in document["buffers"]]
    assert "features.0.1.running_mean" in buffer_names
    [group] = document["optimizer"]["groups"]
    assert group["settings"]["momentum"] == "nonzero"
    assert group["settings"]["lr"] == "nonzero"
    assert group["params"] == parameter_names
    assert document["optimizer"]["class"] == "torch.optim.sgd.SGD"


def test_optimizer_over_tensors_outside_the_model_is_described_by_shape() -> None:
    workload = tiny()
    stray = torch.nn.Parameter(torch.zeros(3, 5))
    optimizer = torch.optim.SGD([*workload.model.parameters(), stray], lr=0.1)
    document = workload_document(workload, optimizer)
    assert "<not in model: [3, 5]>" in document["optimizer"]["groups"][0]["params"]


def test_device_key_follows_the_cpu_memory_limit() -> None:
    assert device_key(CpuBackend(2**30)) == device_key(CpuBackend(2**30))
    assert device_key(CpuBackend(2**30)) != device_key(CpuBackend(2**31))
    assert device_key(make_backend("cpu", memory_limit_bytes=512 * 2**20)) == device_key(
        CpuBackend(512 * 2**20)
    )


def test_optimizer_settings_held_as_tensors_or_objects_are_keyed_by_kind() -> None:
    # A tensor learning rate (capturable schedules) counts as its value, zero or not;
    # other objects count by their type.
    def with_lr(lr: object) -> str:
        workload = tiny()
        optimizer = torch.optim.SGD(workload.model.parameters(), lr=0.1)
        optimizer.param_groups[0]["lr"] = lr
        return workload_key(workload, optimizer)

    assert with_lr(torch.tensor(0.1)) == with_lr(torch.tensor(0.5)) == with_lr(0.3)
    assert with_lr(torch.tensor(0.0)) != with_lr(torch.tensor(0.1))
    assert with_lr(object()) == with_lr(object())
    assert with_lr(object()) != with_lr(0.1)


def test_a_learning_rate_scheduler_does_not_change_the_workload_key() -> None:
    import torch

    from tuner.engine.fingerprint import workload_key
    from tuner.engine.workload import load_workload

    workload = load_workload("examples.mlp:workload", {"hidden": 16, "layers": 1})
    optimizer = workload.build_optimizer()
    before = workload_key(workload, optimizer)
    torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=10)
    assert "initial_lr" in optimizer.param_groups[0]  # the scheduler did write to the groups
    assert workload_key(workload, optimizer) == before
