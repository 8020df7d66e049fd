"""The accumulator on a 2-D mesh, four real processes on gloo as (dp, tp) = (2, 2): FSDP ×
tensor parallelism on ``examples.mesh_mlp``. One optimizer step over a global batch of 8
(4 samples a data-parallel group, in 2 micro batches) gives the gradients and parameters of
one process training the same model on both groups' samples, with a mean loss, a
token-weighted one (``loss_units``), a ``(sum, count)`` loss, after an out-of-memory, and
with gradient clipping; the two tensor-parallel ranks of a group share one batch, and a
pair given different samples is refused on every rank instead of training on nonsense."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch

from tests.ddp_ranks import run_ranks
from tests.mesh_ranks import (
    LR,
    MAX_GRAD_NORM,
    SCENARIOS,
    group_batch,
    mesh_mlp,
    run_mesh_rank,
    summed_loss,
    token_units,
)
from tests.services import free_port

WORLD = 4
TIMEOUT_S = 240  # a rank stuck in a collective fails the test instead of hanging it
# fp32, the same operators in another order (sharded matmuls, reduce-scatter, all-reduce).
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("mesh-ranks")
    return run_ranks(
        run_mesh_rank,
        (WORLD, free_port(), str(out), SCENARIOS),
        out,
        world=WORLD,
        timeout_s=TIMEOUT_S,
    )


def _one_process(scenario: str) -> dict[str, Any]:
    """The same model trained in one process on both groups' samples at once."""
    workload = mesh_mlp()
    model = copy.deepcopy(workload.model)
    padded = scenario in ("units", "sum")
    groups = [group_batch(g, padded=padded) for g in range(workload.parallel.mesh(WORLD).dp)]
    joined = tuple(torch.cat(parts) for parts in zip(*groups, strict=True))
    if scenario == "sum":
        total, units = summed_loss(model, joined)
        loss = total / units
    else:
        loss = workload.loss_fn(model, joined)
    loss.backward()
    grad_norm = None
    if scenario == "clip":
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM))
    torch.optim.SGD(model.parameters(), lr=LR).step()
    before = workload.model  # untouched: the copy above was trained
    with torch.no_grad():
        group_losses = [float(summed_loss(before, g)[0]) / token_units(g) for g in groups]
    return {
        "grads": [p.grad.clone() for p in model.parameters()],
        "params": [p.detach().clone() for p in model.parameters()],
        "grad_norm": grad_norm,
        "group_units": [token_units(g) if padded else g[0].shape[0] for g in groups],
        "group_losses": group_losses if padded else [None] * len(groups),
    }


def _assert_close(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for index, (left, right) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(
            left, right, **TOLERANCE, msg=lambda m, i=index: f"tensor {i}: {m}"
        )


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["mean", "units", "sum", "oom", "clip"])
def test_one_step_on_the_mesh_equals_one_process_on_the_global_batch(ranks, scenario) -> None:
    expected = _one_process(scenario)
    parallel = mesh_mlp().parallel
    for rank, result in enumerate(ranks):
        got = result[scenario]
        assert got["error"] is None
        _assert_close(got["grads"], expected["grads"])
        _assert_close(got["params"], expected["params"])
        group = parallel.mesh(WORLD).group_of(rank)
        # A rank reports its group's batch: the units it trained on, not the world's.
        assert got["units"] == expected["group_units"][group]
        if expected["group_losses"][group] is not None:
            assert math.isclose(got["loss"], expected["group_losses"][group], rel_tol=1e-5)
        if scenario == "clip":
            assert math.isclose(got["grad_norm"], expected["grad_norm"], rel_tol=1e-5)
        if scenario == "oom":
            assert (got["split"], got["retries"]) == ([1, 1, 1, 1], 1)


@pytest.mark.slow
def test_the_tensor_parallel_ranks_of_a_group_run_the_same_micro_batches(ranks) -> None:
    for scenario in ("mean", "units", "sum"):
        for first, second in ((ranks[0], ranks[1]), (ranks[2], ranks[3])):
            assert first[scenario]["split"] == second[scenario]["split"]
            assert first[scenario]["loss"] == second[scenario]["loss"]
            assert first[scenario]["units"] == second[scenario]["units"]


@pytest.mark.slow
def test_tensor_parallel_ranks_given_different_samples_are_refused_on_every_rank(ranks) -> None:
    for result in ranks:
        error = result["mismatch"]["error"]
        assert error is not None
        assert "tensor-parallel ranks of data-parallel group(s) [0, 1]" in error
        assert "DistributedSampler(num_replicas=2, rank=MeshShape(4, 2).group_of(rank))" in error
