"""A step the dry run cannot run on fake tensors is said in one line, and nothing else
reaches stderr: torch's fake tensors log the failing kernel's traceback (``log.exception``
in FakeTensorMode: 22 lines on Mixtral's ``aten._grouped_mm``, which asks for bfloat16
inputs) before the exception reaches the dry run, and the dry run drops that record."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from tuner.engine.backends import CpuBackend
from tuner.engine.dry_run import DryRun
from tuner.engine.workload import Workload


class Experts(nn.Module):
    """Two experts applied with ``torch._grouped_mm`` in float32, as a mixture of experts
    groups its tokens: the operator's meta kernel asks for bfloat16 and raises."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(2, 8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half = x.shape[0] // 2
        offsets = torch.tensor([half, x.shape[0]], dtype=torch.int32)
        return torch._grouped_mm(x, self.weight, offs=offsets).square().mean()


def experts() -> Workload:
    torch.manual_seed(0)
    return Workload(
        name="experts",
        model=Experts(),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        make_batch=lambda n: torch.randn(n, 8),
        loss_fn=lambda model, batch: model(batch),
    )


def test_a_kernel_fake_tensors_reject_is_one_line_and_nothing_on_stderr(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    capfd.readouterr()
    with (
        caplog.at_level(logging.WARNING),
        DryRun(experts(), CpuBackend(2**30), headroom=0.0) as dry,
    ):
        assert dry(4) is None
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert said[0].name == "tuner.engine.dry_run"
    assert said[0].getMessage().startswith("dry run of experts stopped at micro batch 4: ")
    assert "the search goes on without predictions" in said[0].getMessage()
    assert "\n" not in said[0].getMessage()
    assert capfd.readouterr().err == ""
