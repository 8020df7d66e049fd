"""The CUDA path on a real GPU. Deselected automatically where torch sees no CUDA device."""

from __future__ import annotations

import gc

import pytest
import torch

from tuner.engine.backends import make_backend
from tuner.engine.probe import Prober
from tuner.engine.profiler import profile_workload
from tuner.engine.workload import load_workload

pytestmark = pytest.mark.gpu
GiB = 2**30


def _gpt():  # a few hundred MiB of activations per sample at this size
    return load_workload("examples.gpt:workload", {"seq_len": 512, "dim": 256, "layers": 4})


def test_model_and_bisect_agree_and_the_boundary_is_real() -> None:
    found = {}
    for strategy in ("model", "bisect"):
        backend = make_backend("cuda", memory_limit_bytes=4 * GiB)
        profile = profile_workload(_gpt(), backend, strategy=strategy, size_cap=512)
        found[strategy] = profile.max_micro_batch_size
        best = profile.probe_at(profile.max_micro_batch_size)
        above = profile.probe_at(profile.max_micro_batch_size + 1)
        assert best is not None
        assert best.fits
        assert above is not None
        assert not above.fits
        assert best.non_torch_bytes > 0  # the CUDA context is counted
    assert found["model"] == found["bisect"] > 0


def test_failing_probes_leave_no_memory_behind() -> None:
    workload = _gpt()
    backend = make_backend("cuda", memory_limit_bytes=2 * GiB)
    with backend.session(), Prober(workload, backend) as prober:
        gc.collect()
        torch.cuda.synchronize()
        baseline = torch.cuda.memory_allocated()
        for _ in range(20):
            assert prober(4096).oom
        gc.collect()
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == baseline


def test_profiling_on_cuda_leaves_the_model_and_optimizer_as_they_were() -> None:
    workload = _gpt()
    workload.model.cuda()
    optimizer = workload.build_optimizer()
    before = {k: v.clone() for k, v in workload.model.state_dict().items()}
    rng = torch.cuda.get_rng_state_all()
    profile_workload(workload, make_backend("cuda", memory_limit_bytes=4 * GiB), size_cap=64)
    after = workload.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert len(optimizer.state) == 0
    assert all(torch.equal(a, b) for a, b in zip(rng, torch.cuda.get_rng_state_all(), strict=True))


def test_the_timeline_at_max_is_replayed_from_torchs_memory_history() -> None:
    # Written without a GPU at hand (the CUDA stand-in is tests/engine/test_timeline_cuda.py):
    # the bound on the difference is the allocator's slack, a cached block handed out whole.
    backend = make_backend("cuda", memory_limit_bytes=4 * GiB)
    profile = profile_workload(_gpt(), backend, size_cap=512)
    best = profile.probe_at(profile.max_micro_batch_size)
    assert best is not None
    assert best.timeline is not None
    timeline = best.timeline
    assert timeline.source == "cuda-memory-history"
    assert best.peak_allocated_bytes is not None
    assert abs(timeline.peak_bytes - best.peak_allocated_bytes) <= 0.02 * best.peak_allocated_bytes
    assert [s.phase for s in timeline.phases] == [
        "forward",
        "backward",
        "forward",
        "backward",
        "optimizer",
    ]
