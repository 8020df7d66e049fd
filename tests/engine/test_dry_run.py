"""tuner.engine.dry_run: the training step on fake tensors predicts a real CPU probe within
what its tracker (a dispatch mode, which sees operators' outputs) cannot see, leaves the
user's objects alone, aims the model search so that it takes two probes on attention and
recurrent models, and steps aside where it cannot run.

The probe's steps are counted by the allocator with no mode active, every allocation
counted: also an operator's own temporaries, which the tracker never sees (12 B of AdamW's
scalars in the optimizer step; a convolution's unfolded input, 35,680 B of 120,848 at
micro batch 8 of the CNN example). A prediction is never above the probe there, and aims
the search only."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn import functional as F

from tests.engine.limits import limit_with_m_star
from tuner.engine.backends import CpuBackend
from tuner.engine.dry_run import DryRun
from tuner.engine.probe import Prober
from tuner.engine.profiler import profile_workload
from tuner.engine.search import bisect_search
from tuner.engine.workload import Workload, load_workload

GPT = ("examples.gpt:workload", {"layers": 1, "dim": 32, "heads": 2, "seq_len": 16, "vocab": 64})
CNN = ("examples.cnn:workload", {"width": 4, "image_size": 8})


class TinyGru(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.rnn = nn.GRU(16, 16, num_layers=2, batch_first=True)
        self.head = nn.Linear(16, 32)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(tokens))
        logits: torch.Tensor = self.head(hidden)
        return logits


def gru_workload(*, item_in_loss: bool = False) -> Workload:
    """A recurrent model; ``item_in_loss`` reads a value in the loss, which fake tensors
    do not have (a data-dependent step)."""
    torch.manual_seed(0)

    def loss_fn(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 32), batch[:, 1:].reshape(-1))
        if item_in_loss and loss.item() < 0:
            raise AssertionError("a cross entropy is never negative")
        return loss

    return Workload(
        model=TinyGru(),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        make_batch=lambda n: torch.randint(0, 32, (n, 9)),
        loss_fn=loss_fn,
        name="tiny-gru",
    )


def families() -> dict[str, Workload]:
    return {
        "attention": load_workload(*GPT),
        "convolution": load_workload(*CNN),
        "recurrent": gru_workload(),
    }


@pytest.mark.slow
def test_the_dry_run_predicts_every_probe_within_what_its_tracker_cannot_see() -> None:
    for family, workload in families().items():
        backend = CpuBackend(2**40)
        with Prober(workload, backend) as prober, DryRun(workload, backend, headroom=0.05) as dry:
            assert dry.available, family
            for size in (1, 3, 8):
                measured = prober(size, enforce_capacity=False)
                predicted = dry(size)
                assert predicted is not None, (family, size)
                unseen = {
                    phase: peak - predicted.phase_peaks_bytes[phase]
                    for phase, peak in measured.phase_peaks_bytes.items()
                }
                # AdamW's scalar temporaries in the optimizer step.
                assert unseen["optimizer"] == 12, (family, size, unseen)
                if family == "convolution":  # its unfolded input, in forward and backward
                    assert (
                        0 < unseen["accumulate"] < 0.35 * measured.phase_peaks_bytes["accumulate"]
                    )
                else:
                    assert unseen["accumulate"] == 0, (family, size, unseen)
                assert predicted.peak_reserved_bytes is not None
                assert measured.peak_reserved_bytes is not None
                assert measured.peak_reserved_bytes >= predicted.peak_reserved_bytes
                assert predicted.breakdown is not None
                assert measured.breakdown is not None
                assert predicted.breakdown.resident_bytes == measured.breakdown.resident_bytes


def test_the_dry_run_leaves_the_model_optimizer_and_rng_alone() -> None:
    workload = load_workload(*GPT)
    optimizer = workload.build_optimizer()  # an instance: the dry run rebuilds its class
    before = {name: p.detach().clone() for name, p in workload.model.named_parameters()}
    rng = torch.get_rng_state()
    with DryRun(workload, CpuBackend(2**30), headroom=0.05) as dry:
        assert dry(4) is not None
    assert torch.equal(torch.get_rng_state(), rng)
    for name, param in workload.model.named_parameters():
        assert torch.equal(param, before[name]), name
        assert param.grad is None
        assert type(param) is nn.Parameter  # not a fake tensor
    assert not optimizer.state
    assert workload.optimizer is optimizer


@pytest.mark.slow
def test_the_model_search_takes_two_probes_where_the_predictions_are_exact() -> None:
    """Aimed by exact predictions: M* fits and M* + 1 does not. Without the dry run the
    searches start at size 1 and take three probes or more. The convolution's predictions
    miss its unfolded input (30% of its peak): aimed too high, the search still ends at
    its M*, in more probes."""
    for family, workload in families().items():
        limit = limit_with_m_star(workload, 6)
        profile = profile_workload(workload, CpuBackend(limit), size_cap=256)
        sizes = [p.micro_batch_size for p in profile.probes]
        assert profile.max_micro_batch_size == 6, (family, sizes)
        if family != "convolution":
            assert sizes == [6, 7], family


@pytest.mark.slow
def test_a_step_fake_tensors_cannot_run_falls_back_to_the_probes() -> None:
    workload = gru_workload(item_in_loss=True)
    backend = CpuBackend(2**30)
    with DryRun(workload, backend, headroom=0.05) as dry:
        assert dry(2) is None
        assert not dry.available
    limit = limit_with_m_star(workload, 5)
    profile = profile_workload(workload, CpuBackend(limit), size_cap=256)
    assert profile.max_micro_batch_size == 5
    assert profile.probes[0].micro_batch_size == 1  # the model search without predictions
    with Prober(gru_workload(item_in_loss=True), CpuBackend(limit)) as prober:
        bisected = bisect_search(prober, cap=256, budget_bytes=prober.budget_bytes)
    assert bisected.max_micro_batch_size == 5


def test_a_workload_across_ranks_has_no_dry_run() -> None:
    workload = load_workload(*GPT)
    workload.parallel = type(workload.parallel)(mode="ddp")
    with DryRun(workload, CpuBackend(2**30), headroom=0.05) as dry:
        assert not dry.available
        assert dry(1) is None


class MaskedMlp(nn.Module):
    """A model that keeps a tensor as a plain attribute, neither parameter nor buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 8)
        self.mask = torch.ones(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layer(x) * self.mask
        return out


def test_the_fake_copy_holds_no_real_tensor_of_the_model() -> None:
    model = MaskedMlp()
    workload = Workload(
        model=model,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        make_batch=lambda n: torch.randn(n, 8),
        loss_fn=lambda m, x: m(x).square().mean(),
    )
    with DryRun(workload, CpuBackend(2**30), headroom=0.05) as dry:
        assert dry(3) is not None
        replica = dry._prober.model  # type: ignore[union-attr]
        assert isinstance(replica.mask, FakeTensor)
        assert all(isinstance(p, FakeTensor) for p in replica.parameters())
    assert type(model.mask) is torch.Tensor
