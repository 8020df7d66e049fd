"""tuner.engine.probe: one measured training step at micro batch m, on the CPU backend."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
import torch

from tests.workloads import non_scalar_loss, tiny
from tuner.core.errors import WorkloadError
from tuner.core.results import ProbeResult, ProbeSettings
from tuner.engine.backends import CpuBackend, LiveBytesTracker
from tuner.engine.probe import Prober
from tuner.engine.workload import Workload, load_workload

BIG = 10**9  # a limit nothing here reaches


def mlp(**options: object) -> Workload:
    defaults: dict[str, object] = {"in_features": 32, "hidden": 64, "layers": 2}
    return load_workload("examples.mlp:workload", {**defaults, **options})


def probe_once(
    workload: Workload,
    size: int,
    *,
    limit: int = BIG,
    headroom: float = 0.0,
    settings: ProbeSettings | None = None,
) -> ProbeResult:
    with Prober(workload, CpuBackend(limit), headroom=headroom, settings=settings) as prober:
        return prober(size)


def test_peak_grows_with_the_micro_batch_size() -> None:
    with Prober(mlp(), CpuBackend(BIG)) as prober:
        peaks = [prober(size).peak_bytes or 0 for size in (1, 64, 256, 512)]
    assert all(p > 0 for p in peaks)
    assert peaks == sorted(peaks)
    assert len(set(peaks)) == len(peaks)


def test_fits_and_oom_flags_follow_the_budget_and_the_capacity() -> None:
    size = 128
    peak = probe_once(mlp(), size).peak_bytes
    assert peak is not None
    # Exactly at the capacity, no headroom: fits. One byte less: runs out of memory.
    at_limit = probe_once(mlp(), size, limit=peak)
    assert (at_limit.fits, at_limit.oom, at_limit.peak_bytes) == (True, False, peak)
    over = probe_once(mlp(), size, limit=peak - 1)
    assert (over.fits, over.oom, over.peak_bytes) == (False, True, None)
    assert over.error is not None
    assert "CPU memory limit exceeded" in over.error
    # Below the capacity but above the budget: it ran, it is measured, it does not fit.
    over_budget = probe_once(mlp(), size, limit=int(peak / 0.9), headroom=0.2)
    assert (over_budget.fits, over_budget.oom, over_budget.peak_bytes) == (False, False, peak)
    within_budget = probe_once(mlp(), size, limit=int(peak / 0.9) + 1, headroom=0.1)
    assert within_budget.fits


def test_adamw_state_is_about_twice_the_parameters() -> None:
    result = probe_once(mlp(), 8)
    assert result.breakdown is not None
    params = result.breakdown.parameters_bytes
    assert params == sum(p.numel() * 4 for p in mlp().model.parameters())
    assert result.breakdown.gradients_bytes == params
    # exp_avg and exp_avg_sq, plus one scalar step counter per parameter tensor.
    assert 2 * params <= result.breakdown.optimizer_state_bytes <= 2 * params + 64


def test_sgd_momentum_state_is_one_copy_of_the_parameters() -> None:
    result = probe_once(mlp(optimizer="sgd"), 8)
    assert result.breakdown is not None
    assert result.breakdown.optimizer_state_bytes == result.breakdown.parameters_bytes


@pytest.mark.parametrize("target", ["examples.mlp:workload", "examples.cnn:workload"])
def test_breakdown_parts_add_up_to_the_allocated_peak(target: str) -> None:
    options = {"hidden": 32} if "mlp" in target else {"width": 4, "image_size": 8}
    result = probe_once(load_workload(target, options), 16)
    breakdown = result.breakdown
    assert breakdown is not None
    parts = (
        breakdown.parameters_bytes
        + breakdown.gradients_bytes
        + breakdown.optimizer_state_bytes
        + breakdown.activations_bytes
    )
    assert parts == result.peak_allocated_bytes
    assert breakdown.activations_bytes > 0
    assert breakdown.allocator_cache_bytes == 0  # the CPU backend has no cache
    assert result.peak_reserved_bytes == result.peak_allocated_bytes


def test_phase_peaks_are_recorded_and_the_largest_is_the_peak() -> None:
    result = probe_once(mlp(), 256)
    assert set(result.phase_peaks_bytes) == {"accumulate", "optimizer"}
    assert max(result.phase_peaks_bytes.values()) == result.peak_allocated_bytes
    # At a large micro batch the activations of forward and backward set the peak.
    assert result.phase_peaks_bytes["accumulate"] > result.phase_peaks_bytes["optimizer"]


@pytest.mark.parametrize(
    ("settings", "steps"),
    [
        # Warm-up and measured steps (counted as they train, and timed as they run).
        (ProbeSettings(), 2 + 1),
        (ProbeSettings(warmup_steps=0), 0 + 1),
        (ProbeSettings(warmup_steps=3, measure_steps=2), 3 + 2),
    ],
)
def test_steps_run_counts_every_training_step(settings: ProbeSettings, steps: int) -> None:
    # Where steps are counted by the operator tracker (no C++ compiler for the exact
    # count), one more, untracked, is timed the way training runs it.
    timed = 1 if CpuBackend(BIG).tracking_slows_steps else 0
    result = probe_once(tiny(), 4, settings=settings)
    assert result.steps_run == steps + timed
    # The step that gathers what needs a mode (the timeline, the blocks) is one more.
    with Prober(tiny(), CpuBackend(BIG), settings=settings, timeline=True) as prober:
        assert prober(4).steps_run == steps + timed + 1


class _RecordingBackend(CpuBackend):
    """The real CPU backend, noting the order of cache releases and tracked blocks."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.events: list[str] = []

    def release_cached(self) -> None:
        self.events.append("release")
        super().release_cached()

    def track(self, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        self.events.append("track")
        return super().track(*args, **kwargs)  # type: ignore[arg-type]


def test_every_probe_starts_from_a_released_cache() -> None:
    """On CUDA the allocator keeps a larger probe's segments reserved: a later, smaller
    probe must release them before its warm-up, or it reads the larger one's peak (seen on
    an H200 before this rule: every probe after one of 159 read 3.47 GiB reserved)."""
    backend = _RecordingBackend(BIG)
    with Prober(mlp(), backend) as prober:
        for size in (64, 8):
            backend.events.clear()
            prober(size)
            assert backend.events[:2] == ["release", "track"]


def test_timing_is_measured() -> None:
    result = probe_once(tiny(), 4)
    assert result.step_time_s is not None
    assert result.step_time_s > 0
    assert result.samples_per_second is not None
    assert result.samples_per_second > 0
    # Two micro batches of four samples per step.
    assert result.samples_per_second == pytest.approx(8 / result.step_time_s)
    assert result.wall_time_s >= result.step_time_s


def test_oom_probe_counts_the_steps_it_started() -> None:
    peak = probe_once(mlp(), 64).peak_bytes
    assert peak is not None
    result = probe_once(mlp(), 64, limit=peak // 2)
    assert result.oom
    assert result.steps_run == 1  # the first warm-up step ran out
    assert result.samples_per_second is None
    assert result.breakdown is None


def test_one_step_probe_under_counts_adamw_by_its_state() -> None:
    # AdamW creates exp_avg and exp_avg_sq in its first step, after forward and backward:
    # a probe that measures the first step misses them at the forward/backward peak.
    size = 512
    warm = probe_once(mlp(), size)
    one_step = probe_once(mlp(), size, settings=ProbeSettings(warmup_steps=0))
    assert warm.peak_bytes is not None
    assert one_step.peak_bytes is not None
    assert warm.breakdown is not None
    missed = warm.peak_bytes - one_step.peak_bytes
    state = warm.breakdown.optimizer_state_bytes
    assert missed == pytest.approx(state, rel=0.05)
    assert missed >= 1.9 * warm.breakdown.parameters_bytes
    # So a limit between the two peaks accepts a size that fails a step later.
    limit = (warm.peak_bytes + one_step.peak_bytes) // 2
    assert probe_once(mlp(), size, limit=limit, settings=ProbeSettings(warmup_steps=0)).fits
    assert probe_once(mlp(), size, limit=limit).oom


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_probes_run_on_cpu_and_save_activation_memory(precision: str) -> None:
    size = 512
    full = probe_once(mlp(hidden=128), size)
    mixed = probe_once(mlp(hidden=128, precision=precision), size)
    assert mixed.fits
    assert not mixed.oom
    assert mixed.peak_bytes is not None
    assert full.peak_bytes is not None
    assert mixed.breakdown is not None
    assert full.breakdown is not None
    # Weights, gradients and optimizer state stay fp32 under autocast ...
    assert mixed.breakdown.parameters_bytes == full.breakdown.parameters_bytes
    assert mixed.breakdown.optimizer_state_bytes == full.breakdown.optimizer_state_bytes
    # ... while the activations are half precision.
    assert mixed.peak_bytes < 0.85 * full.peak_bytes
    assert mixed.peak_bytes > mixed.breakdown.resident_bytes


def test_fp16_steps_the_optimizer_through_the_grad_scaler() -> None:
    workload = mlp(precision="fp16")
    with Prober(workload, CpuBackend(BIG)) as prober:
        result = prober(16)
        # The scaler found finite gradients and let AdamW step: its state exists.
        assert result.breakdown is not None
        assert result.breakdown.optimizer_state_bytes > 0


def test_loss_that_is_not_a_scalar_is_a_workload_error() -> None:
    with pytest.raises(WorkloadError, match=r"scalar tensor.*shape \(4,\)"):
        probe_once(non_scalar_loss(), 4)


@pytest.mark.parametrize(
    ("loss", "kind"),
    [
        (lambda model, batch: 1.5, "float"),
        (lambda model, batch: torch.tensor(1.5), "Tensor"),  # does not require grad
    ],
)
def test_loss_must_be_a_tensor_that_requires_grad(loss: object, kind: str) -> None:
    workload = tiny()
    workload.loss_fn = loss  # type: ignore[assignment]
    with pytest.raises(WorkloadError, match=f"got {kind}"):
        probe_once(workload, 2)


def _live_tensors() -> tuple[int, int]:
    """Count and total storage bytes of every tensor the garbage collector can see."""
    # type(), not isinstance(): some torch module objects warn when asked for __class__.
    tensors = [obj for obj in gc.get_objects() if issubclass(type(obj), torch.Tensor)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return len(tensors), sum(storages.values())


@pytest.fixture
def gc_disabled() -> Iterator[None]:
    """Memory must come back by reference counting alone, as on a GPU right after an OOM."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.slow
@pytest.mark.usefixtures("gc_disabled")
def test_twenty_out_of_memory_probes_leave_no_tensors_behind() -> None:
    workload = mlp()
    backend = CpuBackend(400_000)
    with Prober(workload, backend) as prober:
        assert prober(1).fits
        assert prober(2048).oom  # the first OOM may create lazy, lasting objects
        before = _live_tensors()
        for _ in range(20):
            result = prober(2048)
            assert result.oom
        after = _live_tensors()
    assert after == before


def test_out_of_memory_probes_leave_no_trackers_or_tracked_storages() -> None:
    workload = mlp()
    parameters = list(workload.model.parameters())
    with Prober(workload, CpuBackend(400_000)) as prober:
        for _ in range(20):
            assert prober(2048).oom
    gc.collect()
    assert not [obj for obj in gc.get_objects() if type(obj) is LiveBytesTracker]
    # A tracker puts a weakref on every storage it counts; none may stay behind.
    assert [weakref.getweakrefcount(p.untyped_storage()) for p in parameters] == [0] * len(
        parameters
    )


def test_probes_after_an_out_of_memory_measure_the_same_peak() -> None:
    # Nothing from the failed step lingers in the next measurement.
    with Prober(mlp(), CpuBackend(400_000)) as prober:
        first = prober(32).peak_bytes
        assert prober(2048).oom
        again = prober(32).peak_bytes
    assert first is not None
    assert first == again


def test_prober_on_a_prebuilt_optimizer_instance() -> None:
    workload = tiny()
    optimizer = torch.optim.SGD(workload.model.parameters(), lr=0.1)
    workload.optimizer = optimizer
    with Prober(workload, CpuBackend(BIG)) as prober:
        assert prober.optimizer is optimizer
        result = prober(3)
    assert result.breakdown is not None
    assert result.breakdown.optimizer_state_bytes == 0  # plain SGD keeps no state


def test_per_sample_loss_is_refused_even_though_it_passes_at_micro_batch_one() -> None:
    # At micro batch 1 a per-sample loss has one element and autograd accepts it; the
    # search's next, larger probe must still say what is wrong with the workload.
    with Prober(non_scalar_loss(), CpuBackend(BIG)) as prober:
        assert prober(1).fits
        with pytest.raises(WorkloadError, match=r"scalar tensor.*shape \(2,\)"):
            prober(2)
