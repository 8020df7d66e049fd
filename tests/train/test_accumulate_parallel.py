"""The accumulator on workloads declared DDP or FSDP, two real processes on gloo: the
gradient equals the single-process full batch's for both FSDP sync styles and for DDP
with bucket views zeroed in place, and an out-of-memory met by every rank is recovered."""

from __future__ import annotations

import pytest
import torch

from tests.accumulate_helpers import full_batch_gradients, relative_difference, tiny_gpt
from tests.ddp_ranks import STEPS, global_batch, run_parallel_rank, run_ranks
from tests.services import free_port

WORLD = 2
TIMEOUT_S = 120  # a hang fails here instead of holding CI


def _run(tmp_path, mode: str, gradient_sync: str = "every", oom_above: int = 10**9) -> list:
    return run_ranks(
        run_parallel_rank,
        (WORLD, free_port(), str(tmp_path), mode, gradient_sync, oom_above),
        tmp_path,
        world=WORLD,
        timeout_s=TIMEOUT_S,
    )


@pytest.fixture(scope="module")
def expected() -> list[torch.Tensor]:
    return full_batch_gradients(tiny_gpt(), global_batch())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "gradient_sync", "wrapper"),
    [
        ("ddp", "every", "DistributedDataParallel"),
        ("fsdp", "every", "FSDPTinyGpt"),
        ("fsdp", "last", "FSDPTinyGpt"),
    ],
)
def test_gradients_equal_the_single_process_full_batch(
    tmp_path, expected, mode, gradient_sync, wrapper
) -> None:
    ranks = _run(tmp_path, mode, gradient_sync)
    for result in ranks:
        assert result["wrapper"] == wrapper
        assert result["splits"] == [[4, 2]] * STEPS  # 6 samples a rank: uneven
        assert relative_difference(result["grads"], expected) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_an_out_of_memory_on_every_rank_halves_together(tmp_path, expected, mode) -> None:
    ranks = _run(tmp_path, mode, oom_above=2)
    for result in ranks:
        assert result["micro_batch_size"] == 2
        assert result["retries"] == [1, 0]
        assert result["splits"] == [[2, 2, 2]] * STEPS
        assert relative_difference(result["grads"], expected) <= 1e-5
