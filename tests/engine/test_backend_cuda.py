"""The CUDA backend's bookkeeping, with the CUDA device simulated.

No GPU exists on this machine, so these tests replace the handful of ``torch.cuda``
functions the backend calls with a small fake allocator. That is the only simulation:
the backend code under test is the real one. ``tests/engine/test_gpu.py`` runs the same paths
on a real device where one is present.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tuner.core.errors import DeviceUnavailableError
from tuner.engine.backends import PeakReading, make_backend
from tuner.engine.backends.cuda import CudaBackend
from tuner.engine.fingerprint import device_key
from tuner.engine.probe import fits_budget

GiB = 2**30


class FakeAllocator:
    """Just enough of torch.cuda's memory statistics to drive the backend."""

    def __init__(self, total: int = 80 * GiB) -> None:
        self.total = total
        self.reserved = 2 * GiB
        self.live = 2 * GiB  # what empty_cache leaves reserved: the blocks in use
        self.context = 500 * 2**20  # CUDA context and other processes
        self.peak_allocated = 0
        self.peak_reserved = 0
        self.retries = 0
        self.fraction: float | None = None
        self.empty_cache_calls = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        cuda = torch.cuda
        props = SimpleNamespace(
            name="NVIDIA H100 80GB HBM3", total_memory=self.total, major=9, minor=0
        )
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "current_device", lambda: 0)
        monkeypatch.setattr(cuda, "get_device_properties", lambda _device: props)
        monkeypatch.setattr(
            cuda,
            "mem_get_info",
            lambda _device=None: (self.total - self.reserved - self.context, self.total),
        )
        monkeypatch.setattr(cuda, "memory_reserved", lambda _device=None: self.reserved)
        monkeypatch.setattr(cuda, "synchronize", lambda _device=None: None)
        monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda _device=None: self._reset())
        monkeypatch.setattr(cuda, "max_memory_allocated", lambda _device=None: self.peak_allocated)
        monkeypatch.setattr(cuda, "max_memory_reserved", lambda _device=None: self.peak_reserved)
        monkeypatch.setattr(
            cuda, "memory_stats", lambda _device=None: {"num_alloc_retries": self.retries}
        )
        monkeypatch.setattr(cuda, "empty_cache", lambda: self._empty())
        monkeypatch.setattr(
            cuda,
            "set_per_process_memory_fraction",
            lambda fraction, _device=None: self._cap(fraction),
        )

    def _reset(self) -> None:
        self.peak_allocated = 0
        self.peak_reserved = self.reserved

    def _empty(self) -> None:
        self.empty_cache_calls += 1
        self.reserved = self.live

    def _cap(self, fraction: float) -> None:
        self.fraction = fraction

    def run(self, allocated: int, reserved: int, retries: int = 0) -> None:
        self.peak_allocated = max(self.peak_allocated, allocated)
        self.peak_reserved = max(self.peak_reserved, reserved)
        # A caching allocator keeps the segments it grew to until empty_cache.
        self.reserved = max(self.reserved, reserved)
        self.retries += retries


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeAllocator:
    allocator = FakeAllocator()
    allocator.install(monkeypatch)
    return allocator


def test_peaks_and_retries_of_a_block_are_read_from_the_allocator(fake: FakeAllocator) -> None:
    backend = CudaBackend()
    fake.retries = 4  # retries before the block must not count
    with backend.track([]) as reading:
        fake.run(allocated=10 * GiB, reserved=12 * GiB, retries=1)
    assert (reading.allocated_bytes, reading.reserved_bytes, reading.alloc_retries) == (
        10 * GiB,
        12 * GiB,
        1,
    )


def test_phases_are_measured_apart_and_the_block_keeps_the_largest(fake: FakeAllocator) -> None:
    backend = CudaBackend()
    with backend.track([]) as reading:
        fake.run(allocated=30 * GiB, reserved=32 * GiB)
        backend.end_phase(reading, "accumulate")
        fake.run(allocated=20 * GiB, reserved=32 * GiB)
        backend.end_phase(reading, "optimizer")
    assert reading.phases == {"accumulate": 30 * GiB, "optimizer": 20 * GiB}
    assert reading.allocated_bytes == 30 * GiB


def test_memory_outside_torch_is_total_minus_free_minus_reserved(fake: FakeAllocator) -> None:
    assert CudaBackend().non_torch_bytes() == fake.context


def test_a_limit_caps_the_allocator_for_the_session_only(fake: FakeAllocator) -> None:
    backend = make_backend("cuda", memory_limit_bytes=40 * GiB)
    assert backend.capacity_bytes == 40 * GiB
    with backend.session():
        assert fake.fraction == pytest.approx(0.5)
    assert fake.fraction == 1.0


def test_a_limit_above_the_card_is_the_card(fake: FakeAllocator) -> None:
    backend = make_backend("cuda", memory_limit_bytes=200 * GiB)
    assert backend.capacity_bytes == fake.total
    with backend.session():
        assert fake.fraction is None


def test_device_key_names_the_card_and_changes_with_the_limit(fake: FakeAllocator) -> None:
    whole, capped = CudaBackend(), CudaBackend(limit_bytes=40 * GiB)
    assert whole.describe().name == "NVIDIA H100 80GB HBM3"
    assert capped.describe().name == "NVIDIA H100 80GB HBM3 (40 GiB limit)"
    assert whole.key_fields()["compute_capability"] == "9.0"
    assert device_key(whole) == device_key(CudaBackend())
    assert device_key(whole) != device_key(capped)


def test_release_cached_empties_the_cache(fake: FakeAllocator) -> None:
    CudaBackend().release_cached()
    assert fake.empty_cache_calls == 1


@pytest.mark.slow
def test_a_probe_after_a_larger_one_reads_its_own_reserved_peak(fake: FakeAllocator) -> None:
    """The sequence a Prober runs (release, then track) for a large probe, then a small one.
    Without the release, the small probe's reserved peak is the large one's cached 60 GiB."""
    backend = CudaBackend()
    peaks = []
    for reserved in (60 * GiB, 10 * GiB):
        backend.release_cached()
        with backend.track([]) as reading:
            fake.run(allocated=reserved - GiB, reserved=reserved)
        peaks.append(reading.reserved_bytes)
    assert peaks == [60 * GiB, 10 * GiB]
    with backend.track([]) as stale:  # no release: the cache of the last probe stays
        fake.run(allocated=GiB, reserved=3 * GiB)
    assert stale.reserved_bytes == 10 * GiB


def test_fits_counts_memory_outside_torch_and_refuses_retries() -> None:
    budget = 76 * GiB
    assert fits_budget(PeakReading(70 * GiB, 75 * GiB), non_torch_bytes=GiB, budget_bytes=budget)
    assert not fits_budget(
        PeakReading(70 * GiB, 75 * GiB), non_torch_bytes=2 * GiB, budget_bytes=budget
    )
    assert not fits_budget(
        PeakReading(70 * GiB, 70 * GiB, alloc_retries=1), non_torch_bytes=0, budget_bytes=budget
    )


def test_cuda_without_a_device_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceUnavailableError, match="--device cpu"):
        make_backend("cuda")
