"""tuner.engine.profiler: the real search on real example models, and what it says when nothing
fits."""

from __future__ import annotations

import pytest
import torch

from tests.workloads import tiny
from tuner.core.errors import BadInputError
from tuner.core.results import DeviceInfo, ProbeResult, ProbeSettings, Profile, WorkloadInfo
from tuner.engine.backends import CpuBackend
from tuner.engine.probe import Prober
from tuner.engine.profiler import nothing_fits_advice, profile_workload
from tuner.engine.workload import Workload, load_workload

# Small models with limits that put M* in the tens to hundreds.
EXAMPLES: dict[str, tuple[str, dict[str, object], int]] = {
    "mlp": ("examples.mlp:workload", {"in_features": 32, "hidden": 64, "layers": 2}, 1_000_000),
    "cnn": ("examples.cnn:workload", {"width": 4, "image_size": 8}, 1_500_000),
    "gpt": (
        "examples.gpt:workload",
        {"vocab": 64, "seq_len": 16, "dim": 16, "layers": 1, "heads": 2},
        1_500_000,
    ),
}


def example(name: str) -> tuple[Workload, int]:
    target, options, limit = EXAMPLES[name]
    return load_workload(target, options), limit


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_model_and_bisect_agree_and_the_answer_is_pinned_by_probes(name: str) -> None:
    profiles = {}
    for strategy in ("model", "bisect"):
        workload, limit = example(name)
        profiles[strategy] = profile_workload(workload, CpuBackend(limit), strategy=strategy)
    found = profiles["model"].max_micro_batch_size
    assert found == profiles["bisect"].max_micro_batch_size
    assert 2 < found < 4096
    for profile in profiles.values():
        at, above = profile.probe_at(found), profile.probe_at(found + 1)
        assert at is not None
        assert at.fits
        assert above is not None
        assert not above.fits
        sizes = [p.micro_batch_size for p in profile.probes]
        assert len(sizes) == len(set(sizes))
    # Aiming with the affine model takes fewer probes than doubling and bisecting.
    assert len(profiles["model"].probes) < len(profiles["bisect"].probes)


def test_the_answer_holds_when_probed_again_from_scratch() -> None:
    workload, limit = example("mlp")
    found = profile_workload(workload, CpuBackend(limit)).max_micro_batch_size
    fresh, _ = example("mlp")
    with Prober(fresh, CpuBackend(limit), headroom=0.05) as prober:
        assert prober(found).fits
        assert not prober(found + 1).fits


@pytest.mark.slow
def test_profile_describes_the_workload_the_device_and_the_fit() -> None:
    workload, limit = example("mlp")
    profile = profile_workload(workload, CpuBackend(limit), headroom=0.1, size_cap=2048)
    assert profile.budget_bytes == int(0.9 * limit)
    assert profile.headroom == 0.1
    assert profile.size_cap == 2048
    assert profile.strategy == "model"
    assert profile.device.kind == "cpu"
    assert profile.device.capacity_bytes == limit
    assert profile.workload.name == "mlp-2x64"
    assert profile.workload.target == "examples.mlp:workload"
    assert profile.workload.optimizer == "AdamW"
    assert profile.workload.parameter_count == sum(p.numel() for p in workload.model.parameters())
    assert profile.settings == ProbeSettings()
    assert profile.steps_run == sum(p.steps_run for p in profile.probes) > 0
    assert profile.fit is not None
    assert profile.fit.bytes_per_sample > 0
    # The fit aims; the peak it predicts at M* is near the measured one.
    measured = profile.probe_at(profile.max_micro_batch_size)
    assert measured is not None
    assert measured.footprint_bytes is not None
    assert profile.fit.predict(profile.max_micro_batch_size) == pytest.approx(
        measured.footprint_bytes, rel=0.1
    )
    assert profile.oversize_probe is None


def test_size_cap_bounds_the_answer() -> None:
    profile = profile_workload(tiny(), CpuBackend(10**8), size_cap=6)
    assert profile.max_micro_batch_size == 6
    assert max(p.micro_batch_size for p in profile.probes) == 6


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def probe_started(self, micro_batch_size: int) -> None:
        self.events.append(("started", micro_batch_size))

    def probe_finished(self, result: ProbeResult) -> None:
        self.events.append(("finished", result.micro_batch_size))


@pytest.mark.slow
def test_observer_hears_about_every_probe_in_order() -> None:
    recorder = Recorder()
    profile = profile_workload(tiny(), CpuBackend(10**8), size_cap=5, observer=recorder)
    expected = []
    for probe in profile.probes:
        expected += [("started", probe.micro_batch_size), ("finished", probe.micro_batch_size)]
    assert recorder.events == expected


def test_nothing_fits_gives_zero_an_oversize_probe_and_advice() -> None:
    workload, _ = example("mlp")
    limit = 100_000  # below weights, gradients and AdamW state together
    profile = profile_workload(workload, CpuBackend(limit))
    assert profile.max_micro_batch_size == 0
    assert [p.micro_batch_size for p in profile.probes] == [1]
    assert profile.probes[0].oom
    oversize = profile.oversize_probe
    assert oversize is not None
    assert oversize.micro_batch_size == 1
    assert not oversize.oom
    assert not oversize.fits
    assert oversize.breakdown is not None
    assert oversize.peak_bytes is not None
    assert oversize.peak_bytes > limit
    assert oversize.breakdown.optimizer_state_bytes > 0
    advice = nothing_fits_advice(profile, workload)
    for remedy in ("activation checkpointing", "bf16", "optimizer"):
        assert remedy in advice
    assert "Measured at micro batch 1" in advice
    assert "optimizer state" in advice


def test_advice_leaves_out_what_the_workload_already_does() -> None:
    workload = tiny(checkpointing=True, precision="bf16")
    workload.optimizer = lambda params: torch.optim.SGD(params, lr=0.1)
    profile = profile_workload(workload, CpuBackend(1000))
    assert profile.max_micro_batch_size == 0
    advice = nothing_fits_advice(profile, workload)
    assert "activation checkpointing" not in advice
    assert "bf16" not in advice
    assert "lighter optimizer" not in advice  # plain SGD keeps no state
    assert "more memory" in advice


def test_advice_without_a_measurement_falls_back_to_parameter_sizes() -> None:
    # A backend that cannot lift its capacity (CUDA) has no oversize probe: plain data
    # stands for such a profile here.
    workload = tiny()
    profile = Profile(
        workload_key="k",
        device_key="d",
        workload=WorkloadInfo(
            name="tiny",
            precision="fp32",
            activation_checkpointing=False,
            parameter_count=1,
            optimizer="AdamW",
        ),
        device=DeviceInfo(kind="cuda", name="gpu", capacity_bytes=1000),
        headroom=0.05,
        budget_bytes=950,
        strategy="model",
        size_cap=4096,
        max_micro_batch_size=0,
        probes=[ProbeResult(micro_batch_size=1, fits=False, oom=True)],
        fit=None,
        settings=ProbeSettings(),
        wall_time_s=0.1,
    )
    advice = nothing_fits_advice(profile, workload)
    params = sum(p.numel() * 4 for p in workload.model.parameters())
    assert "ran out of memory before finishing" in advice
    assert f"{params} B" in advice


def test_probe_one_over_budget_without_oom_uses_its_own_breakdown() -> None:
    # Probe 1 finishes under the capacity but over the budget: no oversize probe needed.
    workload = tiny()
    peak = profile_workload(tiny(), CpuBackend(10**8), size_cap=1).probes[0].peak_bytes
    assert peak is not None
    profile = profile_workload(workload, CpuBackend(int(peak / 0.6)), headroom=0.5)
    assert profile.max_micro_batch_size == 0
    assert profile.oversize_probe is None
    assert not profile.probes[0].oom
    assert "Measured at micro batch 1" in nothing_fits_advice(profile, workload)


@pytest.mark.parametrize("headroom", [1.0, -0.1, 1.5])
def test_headroom_outside_zero_to_one_is_refused(headroom: float) -> None:
    with pytest.raises(BadInputError, match=r"headroom .* outside \[0, 1\)"):
        profile_workload(tiny(), CpuBackend(10**8), headroom=headroom)


@pytest.mark.parametrize("size_cap", [0, -3])
def test_size_cap_below_one_is_refused(size_cap: int) -> None:
    with pytest.raises(BadInputError, match="positive micro batch size"):
        profile_workload(tiny(), CpuBackend(10**8), size_cap=size_cap)


def test_unknown_strategy_is_refused_before_any_probe() -> None:
    workload = tiny()
    with pytest.raises(BadInputError, match="unknown strategy 'fastest'"):
        profile_workload(workload, CpuBackend(10**8), strategy="fastest")
    # Refused before probing: the optimizer factory was never even called.
    assert not isinstance(workload.optimizer, torch.optim.Optimizer)
