"""The accumulating loop in the corners real training reaches: micro batches with no loss
units, ``(sum, count)`` losses, a split given as is, outputs kept for metrics, the batch
moved to the device one micro batch at a time, and out-of-memory errors in the optimizer
step and after BatchNorm has already counted a micro batch."""

from __future__ import annotations

import copy
import inspect
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.accumulate_helpers import (
    frozen_sgd,
    full_batch_gradients,
    gradients,
    relative_difference,
    tiny_gpt,
)
from tuner.core.errors import BadInputError
from tuner.engine.workload import load_workload
from tuner.train import accumulate
from tuner.train.accumulate import Accumulator, no_forward_buffer_sync
from tuner.train.recovery import OptimizerOutOfMemoryError

IGNORE = -100


def _padded_gpt_batch(samples: int, empty: list[int]) -> tuple[object, dict[str, torch.Tensor]]:
    """A tiny GPT and a batch whose samples ``empty`` have every label ignored (an
    answer truncated away)."""
    workload = tiny_gpt()
    torch.manual_seed(7)
    batch = workload.make_batch(samples)
    for index in empty:
        batch["labels"][index] = IGNORE
    return workload, batch


def _sum_and_count(model: nn.Module, batch: dict[str, torch.Tensor]):
    logits = model(batch["input_ids"])
    labels = batch["labels"].flatten()
    total = F.cross_entropy(
        logits.flatten(0, 1).float(), labels, ignore_index=IGNORE, reduction="sum"
    )
    return total, (labels != IGNORE).sum()


@pytest.mark.parametrize("style", ["mean", "sum"])
def test_a_micro_batch_with_no_units_adds_nothing_and_poisons_nothing(style) -> None:
    workload, batch = _padded_gpt_batch(4, empty=[2])
    expected = full_batch_gradients(workload, batch)
    model = copy.deepcopy(workload.model)
    loss_fn = workload.loss_fn if style == "mean" else _sum_and_count
    accumulator = Accumulator(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        micro_batch_size=1,
        loss_fn=loss_fn,
        loss_units=workload.loss_units if style == "mean" else None,
    )
    before = [p.detach().clone() for p in model.parameters()]
    report = accumulator.step(batch)
    assert report.split == [1, 1, 1, 1]
    assert math.isfinite(report.loss)
    # The step's loss is the mean over the tokens of the other three samples.
    with torch.no_grad():
        reference = workload.loss_fn(copy.deepcopy(workload.model), batch)
    assert report.loss == pytest.approx(float(reference), rel=1e-5)
    assert report.units == int((batch["labels"] != IGNORE).sum())
    stepped = [(b - p.detach()) / 0.1 for b, p in zip(before, model.parameters(), strict=True)]
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert relative_difference(stepped, expected) <= 1e-4


def test_a_sum_and_count_loss_gives_the_mean_loss_gradient() -> None:
    workload, batch = _padded_gpt_batch(6, empty=[])
    expected = full_batch_gradients(workload, batch)
    model = copy.deepcopy(workload.model)
    accumulator = Accumulator(model, frozen_sgd(model), micro_batch_size=4, loss_fn=_sum_and_count)
    report = accumulator.step(batch)
    assert report.split == [3, 3]
    assert relative_difference(gradients(model), expected) <= 1e-5
    assert isinstance(report.units, int)
    assert report.units == int((batch["labels"] != IGNORE).sum())


def test_a_loss_function_must_keep_one_form() -> None:
    workload, batch = _padded_gpt_batch(4, empty=[])
    calls = [0]

    def flip_flop(model, part):
        calls[0] += 1
        return _sum_and_count(model, part) if calls[0] == 1 else workload.loss_fn(model, part)

    model = copy.deepcopy(workload.model)
    accumulator = Accumulator(model, frozen_sgd(model), micro_batch_size=2, loss_fn=flip_flop)
    with pytest.raises(BadInputError, match="one form"):
        accumulator.step(batch)
    bad = Accumulator(model, frozen_sgd(model), micro_batch_size=2, loss_fn=lambda m, p: "x")
    with pytest.raises(BadInputError, match="scalar tensor"):
        bad.step(batch)


def test_loss_units_may_return_a_tensor() -> None:
    workload, batch = _padded_gpt_batch(4, empty=[])
    report = _accumulator(workload, 2, loss_units=lambda p: (p["labels"] != IGNORE).sum()).step(
        batch
    )
    assert type(report.units) is int


def _accumulator(workload, micro, **options) -> Accumulator:
    model = copy.deepcopy(workload.model)
    return Accumulator(
        model,
        frozen_sgd(model),
        micro_batch_size=micro,
        loss_fn=options.pop("loss_fn", workload.loss_fn),
        loss_units=options.pop("loss_units", workload.loss_units),
        **options,
    )


def test_a_split_runs_as_given_and_other_batches_split_evenly() -> None:
    workload, batch = _padded_gpt_batch(7, empty=[])
    accumulator = _accumulator(workload, 4, split=[4, 2, 1])
    assert accumulator.step(batch).split == [4, 2, 1]
    odd = {key: value[:6] for key, value in batch.items()}  # the last batch of an epoch
    assert accumulator.step(odd).split == [3, 3]
    with pytest.raises(BadInputError, match="at most micro_batch_size=4"):
        _accumulator(workload, 4, split=[5, 2])
    with pytest.raises(BadInputError, match="positive"):
        _accumulator(workload, 4, split=[4, 0])


def test_outputs_are_kept_only_when_asked() -> None:
    workload, batch = _padded_gpt_batch(5, empty=[])
    assert _accumulator(workload, 2).step(batch).outputs is None
    report = _accumulator(workload, 2, keep_outputs=True).step(batch)
    assert [tuple(o.shape) for o in report.outputs] == [(2, 16, 64), (2, 16, 64), (1, 16, 64)]
    assert not any(o.requires_grad for o in report.outputs)

    def accuracy(logits, part):
        mask = part["labels"] != IGNORE
        return int((logits.argmax(-1) == part["labels"])[mask].sum())

    counted = _accumulator(workload, 2, keep_outputs=accuracy).step(batch)
    assert all(isinstance(hits, int) for hits in counted.outputs)
    assert len(counted.outputs) == 3


def test_each_micro_batch_moves_to_the_device_as_it_is_used(monkeypatch) -> None:
    # No GPU here: the model's device is stood in for by "cuda" and the copy is recorded
    # instead of made, to show that the device holds one micro batch at a time.
    events: list[tuple[str, int]] = []

    def record_move(part, device):
        events.append((f"move to {device}", part["input_ids"].shape[0]))
        return part

    workload, batch = _padded_gpt_batch(7, empty=[])
    inner = workload.loss_fn

    def loss_fn(model, part):
        events.append(("forward", part["input_ids"].shape[0]))
        return inner(model, part)

    monkeypatch.setattr(accumulate, "to_device", record_move)
    monkeypatch.setattr(accumulate, "_device_of", lambda model: torch.device("cuda", 0))
    monkeypatch.setattr(accumulate, "autocast", lambda precision, device_type: torch.enable_grad())
    _accumulator(workload, 3, loss_fn=loss_fn).step(batch)
    assert events == [
        ("move to cuda:0", 3),
        ("forward", 3),
        ("move to cuda:0", 2),
        ("forward", 2),
        ("move to cuda:0", 2),
        ("forward", 2),
    ]


# -- out of memory in the optimizer step --------------------------------------------------


class FirstStepRunsOutAtStateAllocation(torch.optim.Adam):
    """Adam whose first step allocates its moments, then runs out of memory before
    writing anything: what a first step on a nearly full GPU does."""

    failures = 1

    def step(self, closure=None):  # type: ignore[override]
        if self.failures:
            self.failures -= 1
            for group in self.param_groups:
                for parameter in group["params"]:
                    self.state[parameter]["exp_avg"] = torch.zeros_like(parameter)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
        return super().step(closure)


class RunsOutAfterUpdating(torch.optim.SGD):
    """SGD that changes the parameters, then runs out of memory."""

    def step(self, closure=None):  # type: ignore[override]
        with torch.no_grad():
            for group in self.param_groups:
                for parameter in group["params"]:
                    parameter.add_(parameter.grad, alpha=-0.1)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")


class AlwaysRunsOut(torch.optim.Adam):
    def step(self, closure=None):  # type: ignore[override]
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")


def _one_step(optimizer_type, workload, batch):
    model = copy.deepcopy(workload.model)
    optimizer = optimizer_type(model.parameters(), lr=0.01)
    accumulator = Accumulator(
        model,
        optimizer,
        micro_batch_size=2,
        loss_fn=workload.loss_fn,
        loss_units=workload.loss_units,
    )
    accumulator.step(batch)
    return model, optimizer


def test_an_optimizer_step_that_ran_out_before_writing_is_redone_exactly() -> None:
    workload, batch = _padded_gpt_batch(4, empty=[])
    expected, reference = _one_step(torch.optim.Adam, workload, batch)
    model, optimizer = _one_step(FirstStepRunsOutAtStateAllocation, workload, batch)
    assert optimizer.failures == 0
    for got, want in zip(model.parameters(), expected.parameters(), strict=True):
        torch.testing.assert_close(got, want)
    # One step's state: the retry did not count a step twice.
    steps = {float(state["step"]) for state in optimizer.state.values()}
    assert steps == {float(s["step"]) for s in reference.state.values()} == {1.0}


def test_an_optimizer_step_that_already_wrote_is_not_redone() -> None:
    workload, batch = _padded_gpt_batch(4, empty=[])
    with pytest.raises(OptimizerOutOfMemoryError, match=r"already updated .* cannot be redone"):
        _one_step(RunsOutAfterUpdating, workload, batch)


def test_an_optimizer_step_that_runs_out_twice_names_the_state_size() -> None:
    workload, batch = _padded_gpt_batch(4, empty=[])
    with pytest.raises(OptimizerOutOfMemoryError, match=r"twice .* of state for .* of parameters"):
        _one_step(AlwaysRunsOut, workload, batch)


# -- BatchNorm statistics across a retry --------------------------------------------------


def test_a_retry_does_not_count_batchnorm_statistics_twice() -> None:
    workload = load_workload("examples.cnn:workload", {"width": 8, "image_size": 8})
    torch.manual_seed(3)
    batch = workload.make_batch(8)

    def run(micro: int, fail_above: int):
        model = copy.deepcopy(workload.model)

        def loss_fn(module, part):
            loss = workload.loss_fn(module, part)  # the forward has updated the statistics
            if part[0].shape[0] > fail_above:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 MiB")
            return loss

        with pytest.warns(UserWarning, match="BatchNorm"):
            accumulator = Accumulator(
                model, frozen_sgd(model), micro_batch_size=micro, loss_fn=loss_fn
            )
        report = accumulator.step(batch)
        return report, {
            k: v.clone() for k, v in model.state_dict().items() if "running" in k or "tracked" in k
        }

    retried, stats = run(8, fail_above=2)
    assert retried.oom_retries == 2
    assert retried.split == [2, 2, 2, 2]
    _, clean = run(2, fail_above=8)
    assert stats
    assert stats.keys() == clean.keys()
    for key in stats:
        torch.testing.assert_close(stats[key], clean[key])


def test_the_buffer_sync_advice_names_an_argument_this_torch_has() -> None:
    from torch.nn.parallel import DistributedDataParallel

    ((name, value),) = no_forward_buffer_sync().items()
    assert value is False
    assert name in inspect.signature(DistributedDataParallel.__init__).parameters
