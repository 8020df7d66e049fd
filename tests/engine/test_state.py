"""Profiling never changes the user's objects: parameters, buffers, gradients, optimizer
state, RNG streams and train/eval flags are bitwise identical afterwards, OOMs included."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from tests.workloads import WorkloadBug, first_layer, raising_loss, runtime_error_loss, tiny
from tuner.engine.backends import CpuBackend
from tuner.engine.profiler import profile_workload
from tuner.engine.state import TrainingState
from tuner.engine.workload import Workload, load_workload


def bits(tensor: torch.Tensor) -> tuple[str, tuple[int, ...], bytes]:
    """Dtype, shape and raw bytes: equal only when bitwise identical (NaNs and -0.0 too)."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return str(tensor.dtype), tuple(tensor.shape), flat.view(torch.uint8).numpy().tobytes()


def plain(value: Any) -> Any:
    """A comparable copy of optimizer-state and RNG values."""
    if isinstance(value, torch.Tensor):
        return bits(value)
    if isinstance(value, np.ndarray):
        return value.tobytes()
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(plain(item) for item in value)
    return value


def snapshot(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Everything a probe may touch, by value, plus the identities the user holds."""
    names = {id(p): name for name, p in model.named_parameters()}
    return {
        "parameters": {name: bits(p) for name, p in model.named_parameters()},
        "parameter objects": [id(p) for p in model.parameters()],
        "requires_grad": {name: p.requires_grad for name, p in model.named_parameters()},
        "buffers": {name: bits(b) for name, b in model.named_buffers()},
        "gradients": {
            name: None if p.grad is None else bits(p.grad) for name, p in model.named_parameters()
        },
        "optimizer state": {
            names[id(p)]: plain(dict(state)) for p, state in optimizer.state.items()
        },
        "optimizer groups": [
            {key: plain(value) for key, value in group.items() if key != "params"}
            for group in optimizer.param_groups
        ],
        "optimizer params": [[id(p) for p in group["params"]] for group in optimizer.param_groups],
        "training": {name: module.training for name, module in model.named_modules()},
        "torch rng": bits(torch.get_rng_state()),
        "python rng": random.getstate(),
        "numpy rng": plain(np.random.get_state()),
    }


def train_by_hand(workload: Workload, steps: int, *, leave_grads: bool) -> None:
    """Real training steps before profiling, so there is state to protect."""
    optimizer = workload.build_optimizer()
    for _ in range(steps):
        optimizer.zero_grad()
        torch.autograd.backward(workload.loss_fn(workload.model, workload.make_batch(3)))
        optimizer.step()
    if leave_grads:
        optimizer.zero_grad()
        torch.autograd.backward(workload.loss_fn(workload.model, workload.make_batch(2)))


def scramble_rng(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    # Advance the streams to states no seed call produces, and leave a cached gaussian.
    torch.randn(7)
    random.random()
    np.random.standard_normal()


def gpt_workload() -> Workload:
    return load_workload(
        "examples.gpt:workload", {"vocab": 64, "seq_len": 16, "dim": 16, "layers": 1, "heads": 2}
    )


def cnn_workload() -> Workload:
    return load_workload("examples.cnn:workload", {"width": 4, "image_size": 8})


def mlp_workload() -> Workload:
    return load_workload("examples.mlp:workload", {"in_features": 16, "hidden": 32, "layers": 2})


# name: (factory, hand-training steps, leave grads, eval what, CPU limit)
SCENARIOS: dict[str, tuple[Callable[[], Workload], int, bool, str | None, int]] = {
    # AdamW made by a factory: the probe creates the optimizer and its state from nothing.
    "mlp-fresh-adamw-eval-model": (mlp_workload, 0, False, "model", 1_000_000),
    # SGD with momentum that already stepped, BatchNorm stats moved, grads set, one
    # submodule in eval mode.
    "cnn-stepped-sgd-grads-eval-submodule": (cnn_workload, 2, True, "features.1", 2_000_000),
    # AdamW that already stepped (exp_avg, exp_avg_sq, step), tied weights, grads set.
    "gpt-stepped-adamw-grads": (gpt_workload, 2, True, None, 1_500_000),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_profile_leaves_every_user_object_bitwise_identical(name: str) -> None:
    factory, steps, leave_grads, eval_what, limit = SCENARIOS[name]
    workload = factory()
    train_by_hand(workload, steps, leave_grads=leave_grads)
    if eval_what == "model":
        workload.model.eval()
    elif eval_what is not None:
        workload.model.get_submodule(eval_what).eval()
    optimizer = workload.build_optimizer()
    scramble_rng(1234)
    before = snapshot(workload.model, optimizer)

    # No headroom: every size past the boundary runs out of memory mid-step.
    profile = profile_workload(workload, CpuBackend(limit), headroom=0.0, strategy="bisect")

    assert any(p.oom for p in profile.probes), "the scenario must include OOM probes"
    assert profile.max_micro_batch_size > 1, "probes that finished must have trained"
    assert workload.build_optimizer() is optimizer
    after = snapshot(workload.model, optimizer)
    for part in before:
        assert after[part] == before[part], f"{part} changed"


def test_out_of_memory_inside_the_first_optimizer_step_leaves_no_optimizer_state() -> None:
    # AdamW creates exp_avg and exp_avg_sq at its first step; a limit that runs out there
    # leaves half-created state behind unless it is put back.
    workload = mlp_workload()
    optimizer = workload.build_optimizer()
    parameter_bytes = sum(p.numel() * 4 for p in workload.model.parameters())
    scramble_rng(7)
    before = snapshot(workload.model, optimizer)
    profile = profile_workload(workload, CpuBackend(3 * parameter_bytes), headroom=0.0)
    assert profile.max_micro_batch_size == 0
    assert profile.probes[0].oom
    assert len(optimizer.state) == 0
    assert snapshot(workload.model, optimizer) == before


def test_non_oom_error_propagates_unchanged_and_state_is_restored() -> None:
    # The loss works for three calls (a whole optimizer step), then raises.
    workload = raising_loss(after_calls=3)
    optimizer = workload.build_optimizer()
    scramble_rng(99)
    before = snapshot(workload.model, optimizer)
    # (The dry run calls the loss too, and steps aside when it raises: the real probe
    # raises it again, to the user.)
    with pytest.raises(WorkloadBug, match="label index out of range in call") as info:
        profile_workload(workload, CpuBackend(10**8))
    # The workload's own frames are in the traceback the user sees.
    frames = [entry.name for entry in info.traceback]
    assert "raise_workload_bug" in frames
    assert "loss_fn" in frames
    assert any(str(entry.path).endswith("tests/workloads.py") for entry in info.traceback)
    assert snapshot(workload.model, optimizer) == before


def test_plain_runtime_error_is_not_taken_for_out_of_memory() -> None:
    workload = runtime_error_loss()
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as info:
        profile_workload(workload, CpuBackend(10**8))
    assert type(info.value) is RuntimeError


def test_training_state_restores_in_place_and_keeps_identities() -> None:
    workload = tiny()
    train_by_hand(workload, 1, leave_grads=True)
    optimizer = workload.build_optimizer()
    weight = first_layer(workload).weight
    saved = TrainingState.capture(workload.model, optimizer)
    before = snapshot(workload.model, optimizer)
    with torch.no_grad():
        weight.add_(1.0)
    weight.grad = None
    optimizer.state[weight]["exp_avg"].zero_()
    optimizer.param_groups[0]["lr"] = 123.0
    optimizer.param_groups[0]["added_by_step"] = True
    workload.model.eval()
    torch.rand(3)
    saved.restore()
    assert first_layer(workload).weight is weight  # the user's Parameter object survives
    assert "added_by_step" not in optimizer.param_groups[0]
    assert snapshot(workload.model, optimizer) == before


def test_restored_optimizer_keeps_training_like_the_original() -> None:
    # After profiling, one more step gives the same weights as without profiling.
    plain_run, profiled_run = tiny(), tiny()
    for workload in (plain_run, profiled_run):
        torch.manual_seed(4)
        train_by_hand(workload, 2, leave_grads=False)
    profile_workload(profiled_run, CpuBackend(10**6), size_cap=8)
    for workload in (plain_run, profiled_run):
        torch.manual_seed(5)
        train_by_hand(workload, 1, leave_grads=False)
    for a, b in zip(plain_run.model.parameters(), profiled_run.model.parameters(), strict=True):
        assert bits(a) == bits(b)


def test_profile_leaves_no_mode_switched_on_in_the_process() -> None:
    # bf16 autocast and the CPU tracker are both entered inside steps that run out of
    # memory; neither may stay active, and grad mode stays as the user had it.
    workload = load_workload(
        "examples.mlp:workload",
        {"in_features": 16, "hidden": 32, "layers": 2, "precision": "bf16"},
    )
    profile = profile_workload(workload, CpuBackend(400_000), headroom=0.0)
    assert any(p.oom for p in profile.probes)
    assert not torch.is_autocast_enabled("cpu")
    assert torch.is_grad_enabled()
    assert torch._C._len_torch_dispatch_stack() == 0
