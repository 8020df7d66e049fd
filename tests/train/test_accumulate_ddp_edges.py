"""The accumulator's corners under torch.distributed, with two real processes on gloo:
ranks that used different parameters, a micro batch with no loss units where a
collective waits for its backward, ``sync="ddp"`` without DDP, and one report per
out-of-memory."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.accumulate_helpers import relative_difference, tiny_gpt
from tests.ddp_ranks import (
    Branches,
    branches_batch,
    branches_loss,
    padded_batch,
    run_edge_rank,
    run_ranks,
)
from tests.services import free_port

WORLD = 2
TIMEOUT_S = 180  # a rank stuck in a collective fails the test instead of hanging it


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("edge-ranks")
    return run_ranks(
        run_edge_rank, (WORLD, free_port(), str(out)), out, world=WORLD, timeout_s=TIMEOUT_S
    )


def _full_batch(model, loss_fn, batches) -> list[torch.Tensor | None]:
    model = copy.deepcopy(model)
    joined = {key: torch.cat([b[key] for b in batches]) for key in batches[0]}
    loss_fn(model, joined).backward()
    return [None if p.grad is None else p.grad for p in model.parameters()]


@pytest.mark.slow
def test_safe_sync_lines_up_parameters_that_some_ranks_never_used(ranks) -> None:
    model = Branches()
    expected = dict(
        zip(
            [name for name, _ in model.named_parameters()],
            _full_batch(model, branches_loss, [branches_batch(0), branches_batch(1)]),
            strict=True,
        )
    )
    assert expected["unused.weight"] is None
    for result in ranks:
        grads = result["branches"]
        assert grads["unused.weight"] is None  # no rank used it: the optimizer skips it
        for name, want in expected.items():
            if want is not None:
                torch.testing.assert_close(grads[name], want, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_sync_ddp_without_ddp_is_refused_in_one_line(ranks) -> None:
    for result in ranks:
        assert (
            "sync='ddp' on 2 ranks needs the model wrapped in DistributedDataParallel"
            in (result["unwrapped"])
        )


@pytest.mark.slow
@pytest.mark.parametrize("label", ["ddp", "safe", "fsdp"])
def test_a_micro_batch_with_no_units_keeps_the_ranks_in_step(ranks, label) -> None:
    workload = tiny_gpt()
    expected = _full_batch(workload.model, workload.loss_fn, [padded_batch(0), padded_batch(1)])
    for result in ranks:
        got = result[f"empty {label}"]
        assert all(torch.isfinite(g).all() for g in got["grads"])
        assert relative_difference(got["grads"], expected) <= 1e-5
        assert torch.isfinite(torch.tensor(got["loss"]))


@pytest.mark.slow
def test_an_out_of_memory_is_reported_once_from_rank_zero(ranks) -> None:
    assert ranks[0]["oom calls"] == [(3, 1)]
    assert ranks[1]["oom calls"] == []
