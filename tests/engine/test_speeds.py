"""After M*: micro batches timed at a few sizes on a real model (tuner.engine.speeds)."""

from __future__ import annotations

import torch

from tests.workloads import first_layer, tiny
from tuner.answer.local import answer_from
from tuner.engine.backends import CpuBackend
from tuner.engine.probe import Prober
from tuner.engine.profiler import profile_workload
from tuner.engine.speeds import sizes_to_time, time_speeds

MIB = 2**20


def test_the_sizes_cover_every_split_of_the_batch_asked() -> None:
    # b = 256 at M* = 65: 4 × 64, then 8 × 32, 16 × 16 and 32 × 8.
    assert sizes_to_time(65, 256) == [8, 16, 32, 64]
    # b = 250: the fewest is 2 × 63 + 2 × 62, the most 26 × 8 + 6 × 7.
    assert sizes_to_time(65, 250) == [7, 15, 31, 62, 63]
    # Without a batch: M* and its halves.
    assert sizes_to_time(65) == [8, 16, 32, 65]
    assert sizes_to_time(2) == [1, 2]
    # A batch that fits whole: one micro batch of it, then halves.
    assert sizes_to_time(65, 40) == [5, 10, 20, 40]


def test_timing_measures_each_size_in_every_round_and_puts_the_model_back() -> None:
    workload = tiny(width=32)
    before = first_layer(workload).weight.detach().clone()
    backend = CpuBackend(64 * MIB)
    with backend.session(), Prober(workload, backend) as prober:
        speeds = time_speeds(prober, 16, rounds=2)
    assert [t.micro_batch_size for t in speeds.sizes] == [2, 4, 8, 16]
    assert all(len(t.seconds_per_sample) == 2 for t in speeds.sizes)
    assert speeds.optimizer_seconds > 0
    assert torch.equal(first_layer(workload).weight, before)


def test_a_profile_keeps_its_speed_curve_and_the_answer_uses_it() -> None:
    profile = profile_workload(tiny(), CpuBackend(24 * MIB), per_rank_batch_size=96)
    assert profile.speeds is not None
    assert profile.speeds.largest <= profile.max_micro_batch_size
    answer = answer_from(profile, global_batch_size=96)
    # The answer quotes the curve's speed for its whole step, with the rounds' spread.
    assert answer.expected_speed_spread is not None
    assert answer.expected_samples_per_second == profile.speeds.samples_per_second(answer.split)


def test_no_curve_when_told_not_to_time() -> None:
    profile = profile_workload(tiny(), CpuBackend(24 * MIB), time_speeds=False)
    assert profile.speeds is None
    assert answer_from(profile, global_batch_size=96).expected_speed_spread is None
