"""Where the peak is: activations saved per top-level block and the phase of the peak,
measured on real tiny models with the CPU tracker; the CUDA path with the allocator's
statistics stood in (as in test_backend_cuda.py)."""

from __future__ import annotations

import pytest
import torch

from tests.engine.test_backend_cuda import FakeAllocator
from tests.variant_workloads import stack, weights_heavy
from tuner.core.results import OUTSIDE_BLOCKS, ProbeResult
from tuner.engine.backends import CpuBackend, PeakReading
from tuner.engine.backends.cuda import CudaBackend
from tuner.engine.peak import peak_phase, top_level_blocks
from tuner.engine.probe import Prober
from tuner.engine.profiler import heaviest_blocks, peak_advice
from tuner.engine.workload import Workload

GiB = 2**30


def probe(workload: Workload, size: int, *, locate: bool = True) -> ProbeResult:
    backend = CpuBackend(GiB)
    with backend.session(), Prober(workload, backend, locate=locate) as prober:
        return prober(size)


def test_blocks_are_the_children_with_module_lists_opened() -> None:
    names = [name for name, _ in top_level_blocks(stack(layers=2).model)]
    assert names == ["embed", "blocks.0", "blocks.1", "head"]


def test_a_stack_inside_a_wrapper_is_opened_into_its_layers() -> None:
    wrapper = torch.nn.Module()
    wrapper.inner = stack(layers=2).model
    wrapper.extra = torch.nn.Linear(4, 4)
    names = [name for name, _ in top_level_blocks(wrapper)]
    assert names == ["inner.embed", "inner.blocks.0", "inner.blocks.1", "inner.head", "extra"]


def test_locating_names_the_block_that_saves_most_and_leaves_the_peak_unchanged() -> None:
    plain, located = probe(stack(), 4, locate=False), probe(stack(), 4)
    assert located.peak_allocated_bytes == plain.peak_allocated_bytes
    assert located.phase_peaks_bytes == plain.phase_peaks_bytes
    assert plain.breakdown is not None
    assert located.breakdown is not None
    assert plain.breakdown.activations_by_block_bytes == {}
    by_block = located.breakdown.activations_by_block_bytes
    assert list(by_block)[:5] == ["embed", "blocks.0", "blocks.1", "blocks.2", "head"]
    # The first block is four times wider inside: it saves 9 widths a token, the others 3.
    assert by_block["blocks.0"] == 3 * by_block["blocks.1"] == 3 * by_block["blocks.2"] > 0
    assert located.breakdown.peak_phase == "backward"
    doubled = probe(stack(), 8).breakdown
    assert doubled is not None
    assert doubled.activations_by_block_bytes["blocks.0"] == 2 * by_block["blocks.0"]


def test_checkpointed_blocks_keep_only_what_is_saved_outside_them() -> None:
    located = probe(stack(checkpointing=True), 4).breakdown
    assert located is not None
    by_block = located.activations_by_block_bytes
    assert by_block["blocks.0"] == by_block["blocks.1"] == 0
    assert by_block[OUTSIDE_BLOCKS] > 0  # each block's input, held by the checkpoint


def test_a_peak_in_the_optimizer_step_advises_a_lighter_optimizer() -> None:
    workload = weights_heavy()
    result = probe(workload, 1)
    assert result.breakdown is not None
    assert result.breakdown.peak_phase == "optimizer"
    assert result.phase_peaks_bytes["optimizer"] > result.phase_peaks_bytes["accumulate"]
    (advice,) = peak_advice(result, workload)
    assert "optimizer step" in advice
    assert "lighter optimizer" in advice
    assert "checkpointing would not" in advice


def test_a_peak_in_backward_advises_checkpointing_the_heaviest_blocks() -> None:
    workload = stack()
    (advice,) = peak_advice(probe(workload, 4), workload)
    assert "falls in backward" in advice
    assert "activation checkpointing of blocks.0 " in advice
    assert "blocks.1" not in advice


def test_heaviest_blocks_hold_half_and_equal_blocks_go_together() -> None:
    assert heaviest_blocks({"a": 1, "b": 6, "c": 3}) == ["b"]
    assert heaviest_blocks({"a": 4, "b": 4, "c": 4, "d": 4, "e": 1}) == ["a", "b", "c", "d"]
    assert heaviest_blocks({"a": 0}) == []


def test_the_peak_phase_is_the_highest_and_the_earlier_on_a_tie() -> None:
    reading = PeakReading(phases={"forward": 5, "backward": 7, "optimizer": 7})
    assert peak_phase(reading) == "backward"
    assert peak_phase(PeakReading()) is None


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeAllocator:
    allocator = FakeAllocator()
    allocator.install(monkeypatch)
    return allocator


def test_cuda_parts_of_a_step_fold_into_the_phases_without_waiting_for_the_device(
    fake: FakeAllocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = CudaBackend()
    waits: list[object] = []
    with backend.track([]) as reading:
        monkeypatch.setattr(torch.cuda, "synchronize", lambda _device=None: waits.append(1))
        parts = PeakReading()
        fake.run(allocated=20 * GiB, reserved=24 * GiB)
        backend.end_phase(parts, "forward")
        fake.run(allocated=30 * GiB, reserved=32 * GiB)
        backend.end_phase(parts, "backward")
        fake.run(allocated=25 * GiB, reserved=32 * GiB)
        backend.end_phase(reading, "optimizer")
        waited = len(waits)
    assert waited == 0  # the allocator's statistics are host-side and already exact
    assert parts.phases == {"forward": 20 * GiB, "backward": 30 * GiB}
    assert peak_phase(PeakReading(phases={**parts.phases, **reading.phases})) == "backward"
