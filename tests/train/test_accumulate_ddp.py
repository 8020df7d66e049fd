"""DDP with two real processes on gloo: the accumulated gradient equals the single-process
full batch's, gradients are all-reduced once per step, and an out-of-memory on one rank
moves every rank to the same smaller micro batch without a hang."""

from __future__ import annotations

import pytest
import torch

from tests.accumulate_helpers import full_batch_gradients, relative_difference, tiny_gpt
from tests.ddp_ranks import STEPS, global_batch, run_rank, run_ranks
from tests.services import free_port

WORLD = 2
# An out-of-memory must never hang a rank: a stuck test fails here instead.
TIMEOUT_S = 120


def _run(tmp_path, sync: str, oom_on_rank0_above: int = 10**9) -> list[dict]:
    return run_ranks(
        run_rank,
        (WORLD, free_port(), str(tmp_path), sync, oom_on_rank0_above),
        tmp_path,
        world=WORLD,
        timeout_s=TIMEOUT_S,
    )


@pytest.fixture(scope="module")
def expected() -> list[torch.Tensor]:
    return full_batch_gradients(tiny_gpt(), global_batch())


@pytest.mark.slow
@pytest.mark.parametrize("sync", ["safe", "ddp"])
def test_ddp_gradients_equal_the_single_process_full_batch(tmp_path, expected, sync) -> None:
    ranks = _run(tmp_path, sync)
    for result in ranks:
        assert result["splits"] == [[4, 2]] * STEPS  # 6 samples a rank: uneven
        assert relative_difference(result["grads"], expected) <= 1e-5
        # ddp: DDP's reducer all-reduces once a step (one bucket for this model), in the
        # last micro batch only; safe: DDP never syncs, our bucketed all-reduce does.
        assert result["ddp_allreduces"] == (STEPS if sync == "ddp" else 0)


@pytest.mark.slow
@pytest.mark.parametrize("sync", ["safe", "ddp"])
def test_an_out_of_memory_on_one_rank_moves_all_ranks_together(tmp_path, expected, sync) -> None:
    ranks = _run(tmp_path, sync, oom_on_rank0_above=2)
    for result in ranks:
        assert result["micro_batch_size"] == 2
        assert result["retries"] == [1, 0]
        assert result["splits"] == [[2, 2, 2]] * STEPS
        assert relative_difference(result["grads"], expected) <= 1e-5
