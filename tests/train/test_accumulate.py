"""The accumulating loop: the gradient of one step equals the full batch's, and an
out-of-memory at run time loses no sample and counts none twice."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from tests.accumulate_helpers import (
    frozen_sgd,
    full_batch_gradients,
    gradients,
    mlp,
    relative_difference,
    tiny_gpt,
)
from tuner.core.errors import BadInputError
from tuner.engine.backends import CpuBackend
from tuner.engine.backends.base import iter_tensors
from tuner.engine.batching import batch_tensors
from tuner.train.accumulate import Accumulator, OutOfMemoryAtSizeOneError

FP32_TOLERANCE = 1e-5
# bf16 keeps 8 bits of mantissa; the same sums in another order differ by a few 1e-3.
BF16_TOLERANCE = 2e-2


def _accumulated(workload, batch, micro, **options):
    model = copy.deepcopy(workload.model)
    accumulator = Accumulator(
        model,
        frozen_sgd(model),
        micro_batch_size=micro,
        loss_fn=workload.loss_fn,
        loss_units=options.pop("loss_units", workload.loss_units),
        precision=options.pop("precision", workload.precision),
        **options,
    )
    report = accumulator.step(batch)
    return report, gradients(model)


@pytest.mark.parametrize(("samples", "micro", "split"), [(12, 4, [4, 4, 4]), (10, 4, [4, 3, 3])])
def test_even_and_uneven_splits_give_the_full_batch_gradient(samples, micro, split) -> None:
    workload = mlp()
    batch = workload.make_batch(samples)
    report, accumulated = _accumulated(workload, batch, micro)
    assert report.split == split
    assert report.micro_batch_size == micro
    assert relative_difference(accumulated, full_batch_gradients(workload, batch)) <= FP32_TOLERANCE


def test_token_level_loss_with_padding_is_the_mean_over_every_token() -> None:
    workload = tiny_gpt()
    batch = workload.make_batch(9)
    lengths = (batch["labels"] != -100).sum(dim=1)
    assert lengths.unique().numel() > 1  # ragged: per-micro-batch means would be wrong
    _, accumulated = _accumulated(workload, batch, 4)
    expected = full_batch_gradients(workload, batch)
    assert relative_difference(accumulated, expected) <= FP32_TOLERANCE
    # Weighting by samples instead of tokens is measurably wrong: the units matter.
    _, by_samples = _accumulated(workload, batch, 4, loss_units=None)
    assert relative_difference(by_samples, expected) > 100 * FP32_TOLERANCE


def test_bf16_autocast_matches_within_its_precision() -> None:
    workload = mlp(precision="bf16")
    batch = workload.make_batch(10)
    _, accumulated = _accumulated(workload, batch, 4)
    expected = full_batch_gradients(workload, batch, precision="bf16")
    assert relative_difference(accumulated, expected) <= BF16_TOLERANCE


def test_fp16_scales_every_backward_and_unscales_once() -> None:
    workload = mlp(precision="fp16")
    batch = workload.make_batch(8)
    model = copy.deepcopy(workload.model)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    accumulator = Accumulator(
        model,
        frozen_sgd(model),
        micro_batch_size=2,
        loss_fn=workload.loss_fn,
        precision="fp16",
        scaler=scaler,
    )
    report = accumulator.step(batch)
    assert report.optimizer_stepped
    # Unscaled once: gradients are close to fp32 ones, not 2**10 times larger.
    expected = full_batch_gradients(mlp(), batch)
    assert relative_difference(gradients(model), expected) <= 5e-2


def test_clipping_sees_the_accumulated_gradient_and_one_scheduler_step_per_batch() -> None:
    workload = mlp()
    batch = workload.make_batch(10)
    model = copy.deepcopy(workload.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    accumulator = Accumulator(
        model,
        optimizer,
        micro_batch_size=3,
        loss_fn=workload.loss_fn,
        max_grad_norm=1e-3,
        scheduler=scheduler,
    )
    report = accumulator.step(batch)
    full_norm = torch.cat([g.flatten() for g in full_batch_gradients(workload, batch)]).norm()
    assert report.grad_norm == pytest.approx(float(full_norm), rel=1e-4)
    clipped = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    assert float(clipped) <= 1e-3 * (1 + 1e-4)
    accumulator.step(batch)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**2)


def _tracked_step(accumulator, batch, limit):
    """One step with every live tensor byte counted against ``limit``, as on a small GPU."""
    resident = [
        *accumulator.model.parameters(),
        *iter_tensors(dict(accumulator.optimizer.state)),
        *(t for _, t in batch_tensors(batch)),
    ]
    with CpuBackend(limit).track(resident):
        return accumulator.step(batch)


def test_out_of_memory_halves_and_retries_the_same_batch_from_the_start() -> None:
    workload = mlp(hidden=256)
    inputs, targets = workload.make_batch(32)
    batch = (inputs, targets, torch.arange(32))  # sample ids ride along
    attempts: list[list[int]] = []

    def loss_fn(model, part):
        if part[2][0].item() == 0:  # an attempt starts again from the first sample
            attempts.append([])
        attempts[-1].extend(part[2].tolist())
        return workload.loss_fn(model, (part[0], part[1]))

    def accumulator(micro: int, **options) -> Accumulator:
        model = copy.deepcopy(workload.model)
        return Accumulator(
            model, frozen_sgd(model), micro_batch_size=micro, loss_fn=loss_fn, **options
        )

    def peak(micro: int) -> int:
        limit = 2**40
        tracker_limit = CpuBackend(limit)
        acc = accumulator(micro)
        resident = [*acc.model.parameters(), *(t for _, t in batch_tensors(batch))]
        with tracker_limit.track(resident) as reading:
            acc.step(batch)
        return reading.allocated_bytes

    four, eight = peak(4), peak(8)
    assert four < eight
    halvings: list[tuple[int, int]] = []
    acc = accumulator(16, on_oom=lambda failed, new, _message: halvings.append((failed, new)))
    attempts.clear()
    report = _tracked_step(acc, batch, (four + eight) // 2)  # 4 fits, 8 does not

    assert halvings == [(16, 8), (8, 4)]
    assert (report.micro_batch_size, report.oom_retries) == (4, 2)
    assert acc.micro_batch_size == 4  # later steps start from the size that ran
    assert len(attempts) == 3
    assert sorted(attempts[-1]) == list(range(32))  # every sample exactly once
    expected = full_batch_gradients(workload, (inputs, targets))
    assert relative_difference(gradients(acc.model), expected) <= FP32_TOLERANCE


def test_out_of_memory_at_size_one_is_reported_not_looped() -> None:
    workload = mlp()
    model = copy.deepcopy(workload.model)

    def loss_fn(_model, _batch):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    accumulator = Accumulator(model, frozen_sgd(model), micro_batch_size=4, loss_fn=loss_fn)
    with pytest.raises(OutOfMemoryAtSizeOneError, match="micro batch size 1"):
        accumulator.step(workload.make_batch(8))


def test_other_errors_propagate_untouched() -> None:
    workload = mlp()
    model = copy.deepcopy(workload.model)

    def loss_fn(_model, _batch):
        raise KeyError("labels")

    accumulator = Accumulator(model, frozen_sgd(model), micro_batch_size=4, loss_fn=loss_fn)
    with pytest.raises(KeyError, match="labels"):
        accumulator.step(workload.make_batch(8))
    assert accumulator.micro_batch_size == 4


def test_without_recovery_an_out_of_memory_is_raised() -> None:
    workload = mlp()
    model = copy.deepcopy(workload.model)

    def loss_fn(_model, _batch):
        raise torch.OutOfMemoryError("CUDA out of memory.")

    accumulator = Accumulator(
        model, frozen_sgd(model), micro_batch_size=4, loss_fn=loss_fn, recover_from_oom=False
    )
    with pytest.raises(torch.OutOfMemoryError):
        accumulator.step(workload.make_batch(8))


def test_batchnorm_is_warned_about_once_per_model() -> None:
    workload = load_cnn()
    with pytest.warns(UserWarning, match="BatchNorm"):
        Accumulator(
            workload.model, frozen_sgd(workload.model), micro_batch_size=2, loss_fn=workload.loss_fn
        )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Accumulator(
            workload.model, frozen_sgd(workload.model), micro_batch_size=2, loss_fn=workload.loss_fn
        )


def test_for_workload_and_bad_settings() -> None:
    workload = tiny_gpt()
    accumulator = Accumulator.for_workload(workload, 3)
    assert accumulator.loss_units is workload.loss_units
    report = accumulator.step(workload.make_batch(7))
    assert report.split == [3, 2, 2]  # the fewest micro batches, sizes within one
    assert report.units == int((workload.make_batch(7)["labels"] != -100).sum()) or report.units > 0
    with pytest.raises(BadInputError, match="positive"):
        Accumulator.for_workload(workload, 0)
    with pytest.raises(BadInputError, match="sync"):
        Accumulator.for_workload(workload, 2, sync="fast")


def load_cnn():
    from tuner.engine.workload import load_workload

    return load_workload("examples.cnn:workload", {"width": 4, "image_size": 8})


def test_a_parallel_workload_outside_torch_distributed_is_refused_in_one_line() -> None:
    from tuner.core.parallel import Parallel

    workload = tiny_gpt()
    workload.parallel = Parallel(mode="ddp")
    with pytest.raises(BadInputError, match=r"initialize torch\.distributed first"):
        Accumulator.for_workload(workload, 4)
