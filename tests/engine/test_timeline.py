"""Memory over time at M*: the search's answering probe keeps the live bytes of a step,
operator by operator, on a real tiny model with the CPU tracker. The tracker is a dispatch
mode, so the timeline is recorded on a step of its own after the measured one (which runs
with no mode, counted by the allocator). Its peak is the probe's allocated peak within
what the tracker does not see (operators' own temporaries: 0.3% here), its phases follow
the step, and it stays within its bounds however many operators the step runs."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tests.variant_workloads import stack
from tuner.core.results import Profile
from tuner.core.timeline import MAX_TIMELINE_JSON_BYTES, MAX_TIMELINE_POINTS, START_LABEL
from tuner.engine.backends import CpuBackend
from tuner.engine.probe import Prober
from tuner.engine.profiler import profile_workload
from tuner.engine.workload import Workload

MiB = 2**20
STEP_PHASES = ["forward 1", "backward 1", "forward 2", "backward 2", "optimizer"]


@pytest.fixture(scope="module")
def searched() -> Profile:
    """A real search on the CPU tracker: M* and the size above it that does not fit."""
    return profile_workload(stack(layers=2), CpuBackend(2 * MiB), size_cap=64)


def test_the_probe_at_the_answer_keeps_the_timeline_of_its_step(searched: Profile) -> None:
    profile = searched
    answer = profile.max_micro_batch_size
    assert 1 <= answer < 64, "the search must end below its cap"
    assert len(profile.probes) >= 2, "the search must probe around M*"
    at = profile.probe_at(answer)
    assert at is not None
    assert at.fits
    assert at.timeline is not None
    # Weights and optimizer state stay live through the whole step: no point is below them.
    assert at.breakdown is not None
    resident = at.breakdown.parameters_bytes + at.breakdown.optimizer_state_bytes
    assert min(at.timeline.live_bytes) >= resident
    # Only the answering probe keeps one: the others would only make the profile larger.
    assert [p for p in profile.probes if p.timeline is not None] == [at]
    timeline = at.timeline

    assert timeline.source == "cpu-tracker"
    # Another step's, under the tracker: within what the tracker does not see.
    assert at.peak_allocated_bytes is not None
    assert timeline.peak_bytes == pytest.approx(at.peak_allocated_bytes, rel=0.01)
    assert timeline.peak_bytes <= at.peak_allocated_bytes
    assert timeline.peak_bytes == max(timeline.live_bytes)
    assert 2 <= len(timeline.position) <= MAX_TIMELINE_POINTS
    assert timeline.position == sorted(timeline.position)
    assert len(timeline.model_dump_json()) <= MAX_TIMELINE_JSON_BYTES
    # What was live at the start: parameters, gradients, optimizer state and the batch.
    assert timeline.position[0] == 0
    assert timeline.live_bytes[0] > 0
    # Operators by the dispatcher's names (aten.mm, aten.addmm, ...), and the start.
    assert START_LABEL in timeline.operators
    assert {"aten.mm", "aten.addmm"} <= set(timeline.operators)
    assert all(" " not in name for name in timeline.operators if name != START_LABEL)


def test_the_phases_follow_the_step_and_hold_the_peak_where_the_breakdown_says(
    searched: Profile,
) -> None:
    profile = searched
    probe = profile.probe_at(profile.max_micro_batch_size)
    assert probe is not None
    assert probe.timeline is not None
    assert probe.breakdown is not None
    timeline = probe.timeline
    assert [span.label for span in timeline.phases] == STEP_PHASES
    ends = [0] + [span.end for span in timeline.phases]
    assert [span.start for span in timeline.phases] == ends[:-1]  # one after another
    assert all(span.end > span.start for span in timeline.phases)
    assert timeline.phases[-1].end <= timeline.length
    peak_span = timeline.phase_at(timeline.peak_position)
    assert peak_span is not None
    assert peak_span.phase == probe.breakdown.peak_phase
    # Each phase's highest point is the peak the probe measured for that phase.
    forward_and_backward = max(
        b
        for p, b in zip(timeline.position, timeline.live_bytes, strict=True)
        if 0 < p <= timeline.phases[3].end
    )
    assert forward_and_backward == pytest.approx(probe.phase_peaks_bytes["accumulate"], rel=0.01)


class Deep(nn.Module):
    """Many small layers: a step of thousands of operators that change live bytes."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = F.gelu(layer(x))
        return x


def deep(layers: int) -> Workload:
    torch.manual_seed(0)

    def loss_fn(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        return model(batch).square().mean()

    return Workload(
        name=f"deep-{layers}",
        model=Deep(layers),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        make_batch=lambda n: torch.randn(n, 16),
        loss_fn=loss_fn,
    )


def test_a_long_step_is_folded_to_its_bound_and_keeps_its_peak() -> None:
    backend = CpuBackend(256 * MiB)
    with backend.session(), Prober(deep(300), backend, timeline=True) as prober:
        probe = prober(4)
    timeline = probe.timeline
    assert timeline is not None
    assert timeline.samples > MAX_TIMELINE_POINTS  # there was something to fold
    assert len(timeline.position) <= MAX_TIMELINE_POINTS
    assert probe.peak_allocated_bytes is not None
    assert timeline.peak_bytes == pytest.approx(probe.peak_allocated_bytes, rel=0.01)
    assert timeline.length > 4 * 300
    assert len(timeline.model_dump_json()) <= MAX_TIMELINE_JSON_BYTES


def test_recording_changes_no_measurement() -> None:
    peaks = {}
    for record in (False, True):
        backend = CpuBackend(64 * MiB)
        with backend.session(), Prober(stack(layers=2), backend, timeline=record) as prober:
            probe = prober(8)
        assert (probe.timeline is not None) is record
        peaks[record] = (probe.peak_allocated_bytes, probe.phase_peaks_bytes, probe.fits)
    assert peaks[True] == peaks[False]


def test_a_probe_that_runs_out_of_memory_keeps_no_timeline() -> None:
    backend = CpuBackend(MiB // 4)
    with backend.session(), Prober(stack(layers=2), backend, timeline=True) as prober:
        probe = prober(64)
    assert probe.oom
    assert probe.timeline is None


def measure_overhead(workload: Workload, size: int, repeats: int = 3) -> tuple[float, float]:
    """Seconds per probe without and with the timeline (best of ``repeats``)."""
    best = {}
    for record in (False, True):
        times = []
        for _ in range(repeats):
            backend = CpuBackend(1024 * MiB)
            with backend.session(), Prober(workload, backend, timeline=record) as prober:
                started = time.perf_counter()
                prober(size)
                times.append(time.perf_counter() - started)
        best[record] = min(times)
    return best[False], best[True]
