"""``Accumulator.step_samples``: the workload's micro batches made one at a time, as the
probe counted them, where ``step(make_batch(B))`` holds the whole batch beside the step
(on the CPU, above the limit the profile measured by the micro batches waiting their turn).
The same gradient either way, loss units counted as each micro batch is made."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable

import pytest
import torch
from torch import nn

from tuner.core.errors import BadInputError
from tuner.engine.backends import CpuBackend, iter_tensors
from tuner.engine.batching import Batch
from tuner.engine.probe import Prober
from tuner.engine.workload import Workload
from tuner.train.accumulate import Accumulator

FEATURES = 512  # wide inputs: a sample's inputs (2 KiB) weigh next to its activations
ROWS = 64


class Rows:
    """``make_batch(n)``: the next ``n`` rows of a fixed table (and which of them count),
    so that one batch of 8 and two of 4 are the same samples."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.table = torch.randn(ROWS, FEATURES, generator=generator)
        self.keep = torch.arange(ROWS) % 3 != 0
        self.start = 0

    def __call__(self, n: int) -> Batch:
        rows = slice(self.start, self.start + n)
        self.start = (self.start + n) % (ROWS - 16)
        return {"x": self.table[rows].clone(), "keep": self.keep[rows].clone()}


def loss_fn(model: nn.Module, batch: Batch) -> torch.Tensor:
    keep = batch["keep"].float()
    per_sample = model(batch["x"]).square().mean(dim=1)
    return (per_sample * keep).sum() / keep.sum().clamp(min=1)


def workload(*, units: bool = True) -> Workload:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 4))
    return Workload(
        name="rows",
        model=model,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2),
        make_batch=Rows(),
        loss_fn=loss_fn,
        loss_units=(lambda batch: int(batch["keep"].sum())) if units else None,
    )


def resident(accumulator: Accumulator, *extra: torch.Tensor) -> Iterable[torch.Tensor]:
    model = accumulator.model
    yield from model.parameters()
    yield from (p.grad for p in model.parameters() if p.grad is not None)
    yield from iter_tensors(dict(accumulator.optimizer.state))
    yield from extra


def step_peak(backend: CpuBackend, accumulator: Accumulator, run: Callable[[], object]) -> int:
    """The allocated peak of one training step, counted as the probe counts its own."""
    with backend.track(resident(accumulator)) as reading:
        run()
    return reading.allocated_bytes


def test_the_step_holds_one_micro_batch_at_a_time_as_the_probe_counted() -> None:
    micro, samples = 8, 32
    with Prober(workload(), CpuBackend(2**30), headroom=0.0) as prober:
        probed = prober(micro).peak_allocated_bytes
    assert probed is not None

    built = workload()
    accumulator = Accumulator.for_workload(built, micro)
    backend = CpuBackend(2**30)  # made after the model: its weights count as resident
    assert backend.plain_count is not None, "this test needs the exact count (a C++ compiler)"
    for _ in range(2):  # the optimizer's state, as the probe's warm-up makes it
        accumulator.step_samples(samples)
    lazily = step_peak(backend, accumulator, lambda: accumulator.step_samples(samples))
    batch = built.make_batch(samples)
    with backend.track(resident(accumulator, *batch.values())) as reading:
        accumulator.step(batch)
    whole = reading.allocated_bytes
    del batch

    # One micro batch's inputs at a time: within what the probe counted (it holds its
    # micro batch through the optimizer step too, where this step's peak is).
    assert lazily <= probed
    # The whole batch made first holds the micro batches waiting their turn: above it.
    waiting = (samples - micro) * (FEATURES * 4 + 1)
    assert whole > probed
    assert whole - lazily >= waiting


@pytest.mark.parametrize("units", [True, False])
def test_made_micro_batches_give_the_whole_batchs_gradient(units: bool) -> None:
    eager, lazy = workload(units=units), workload(units=units)
    lazy.model = copy.deepcopy(eager.model)
    trained = {
        "eager": Accumulator.for_workload(eager, 3),
        "lazy": Accumulator.for_workload(lazy, 3),
    }
    for _ in range(3):
        by_eager = trained["eager"].step(eager.make_batch(10))
        by_lazy = trained["lazy"].step_samples(10)
        assert by_lazy.split == by_eager.split
        assert by_lazy.units == by_eager.units
        assert by_lazy.loss == pytest.approx(by_eager.loss, rel=1e-5)
    for a, b in zip(eager.model.parameters(), lazy.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_step_samples_needs_the_workloads_batches() -> None:
    model = nn.Linear(4, 1)
    plain = Accumulator(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        micro_batch_size=2,
        loss_fn=lambda m, b: m(b).mean(),
    )
    with pytest.raises(BadInputError, match=r"Accumulator\.for_workload"):
        plain.step_samples(4)
    with pytest.raises(BadInputError, match="positive whole number"):
        Accumulator.for_workload(workload(), 2).step_samples(0)
