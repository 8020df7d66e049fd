"""tuner.engine.backends: the one OOM predicate, the CPU byte tracker, and choosing a backend."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from tuner.core.errors import BadInputError, DeviceUnavailableError
from tuner.engine.backends import (
    CpuBackend,
    LiveBytesTracker,
    PeakReading,
    is_out_of_memory,
    iter_tensors,
    make_backend,
    storage_bytes,
)


@pytest.mark.parametrize(
    "exc",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.77 GiB total)"),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
        RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory: you tried ..."),
    ],
    ids=["OutOfMemoryError", "cuda-message", "cublas", "cudnn", "cpu-allocator"],
)
def test_out_of_memory_forms_are_recognised(exc: BaseException) -> None:
    assert is_out_of_memory(exc)


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 9x16)"),
        RuntimeError("CUDA error: device-side assert triggered"),
        ValueError("CUDA out of memory"),  # the words, but not an error torch raises for it
        MemoryError(),
        KeyError("out of memory"),
    ],
    ids=["shape-mismatch", "device-assert", "value-error", "python-memory-error", "key-error"],
)
def test_other_errors_are_not_out_of_memory(exc: BaseException) -> None:
    assert not is_out_of_memory(exc)


def test_tracker_counts_a_fresh_tensor_and_forgets_it_when_freed() -> None:
    tracker = LiveBytesTracker()
    with tracker:
        tensor = torch.empty(1000, dtype=torch.float32)
        assert tracker.live_bytes == 4000
        view = tensor.view(10, 100)  # a view shares the storage: no new bytes
        assert tracker.live_bytes == 4000
        del tensor
        assert tracker.live_bytes == 4000  # the view keeps the storage alive
        del view
        assert tracker.live_bytes == 0
        assert tracker.peak_bytes == 4000


def test_tracker_peak_is_the_largest_live_total() -> None:
    tracker = LiveBytesTracker()
    with tracker:
        a = torch.ones(100, dtype=torch.float64)  # 800 bytes
        b = a * 2  # +800
        del a
        c = torch.ones(50, dtype=torch.float64)  # 800 + 400 live
        assert tracker.live_bytes == 1200
        assert tracker.peak_bytes == 1600
        tracker.reset_peak()
        assert tracker.peak_bytes == 1200
        del b, c


def test_tracker_raises_out_of_memory_at_the_operator_that_crosses_the_limit() -> None:
    tracker = LiveBytesTracker(limit_bytes=10_000)
    with tracker:
        kept = torch.zeros(1000)  # 4000 bytes: fine
        with pytest.raises(torch.OutOfMemoryError) as info:
            torch.zeros(2000)  # 8000 more: over the limit at once
        assert is_out_of_memory(info.value)
        # The refused tensor is not kept alive by the tracker.
        del info
        assert tracker.live_bytes == 4000
        del kept


def test_out_of_memory_message_reports_the_bytes_that_crossed_the_limit() -> None:
    tracker = LiveBytesTracker(limit_bytes=10_000)
    with tracker:
        kept = torch.zeros(1000)
        with pytest.raises(torch.OutOfMemoryError, match=r"11\.7 KiB live.*limit 9\.77 KiB"):
            torch.zeros(2000)
        del kept


def test_registered_resident_tensors_count_before_any_operator_touches_them() -> None:
    weights = torch.zeros(256)  # allocated before tracking: 1 KiB
    tracker = LiveBytesTracker(limit_bytes=1500)
    tracker.register([weights, weights[:10]])  # a view of the same storage counts once
    assert tracker.live_bytes == tracker.peak_bytes == 1024
    with tracker, pytest.raises(torch.OutOfMemoryError):
        torch.zeros(200)  # 800 bytes on top of the registered 1024


def test_tracker_sees_in_place_resizes() -> None:
    tracker = LiveBytesTracker()
    with tracker:
        tensor = torch.zeros(10)
        assert tracker.live_bytes == 40
        tensor.resize_(100)  # the same storage, grown in place
        assert tracker.live_bytes == tracker.peak_bytes == 400
        del tensor
        assert tracker.live_bytes == 0


def test_cpu_backend_track_reads_the_peak_of_the_block() -> None:
    backend = CpuBackend(10**6)
    resident = torch.zeros(1000)  # 4000 bytes, alive throughout
    with backend.track([resident]) as reading:
        temporary = torch.ones(5000)  # 20000 bytes at the peak
        del temporary
    assert reading.allocated_bytes == reading.reserved_bytes == 24_000
    assert reading.alloc_retries == 0


def test_cpu_backend_enforces_its_capacity_unless_told_not_to() -> None:
    backend = CpuBackend(10_000)
    with pytest.raises(torch.OutOfMemoryError), backend.track([]):
        torch.ones(5000)
    with backend.track([], enforce_capacity=False) as reading:
        torch.ones(5000)
    assert reading.allocated_bytes == 20_000


def test_trackers_do_not_outlive_their_block() -> None:
    backend = CpuBackend(10**6)
    weights = torch.zeros(100)
    for _ in range(5):
        with backend.track([weights]):
            (weights + 1).sum()
    gc.collect()
    # The weakrefs a tracker puts on storages go with it.
    assert weakref.getweakrefcount(weights.untyped_storage()) == 0


def test_cpu_backend_describes_itself_and_its_key_fields() -> None:
    backend = CpuBackend(3 * 2**30)
    info = backend.describe()
    assert info.kind == "cpu"
    assert info.capacity_bytes == 3 * 2**30
    assert info.details["memory_limit_bytes"] == 3 * 2**30
    fields = backend.key_fields()
    assert fields["memory_limit_bytes"] == 3 * 2**30
    assert "+" not in str(fields["torch"])  # the local build suffix does not split keys
    assert backend.non_torch_bytes() == 0


def test_cpu_backend_refuses_a_non_positive_limit() -> None:
    with pytest.raises(ValueError, match="positive"):
        CpuBackend(0)


def test_make_backend_cpu_needs_a_limit() -> None:
    with pytest.raises(BadInputError, match="--memory-limit"):
        make_backend("cpu")
    backend = make_backend("cpu", memory_limit_bytes=2**20)
    assert isinstance(backend, CpuBackend)
    assert backend.capacity_bytes == 2**20


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "mps", "", "cpu0"])
def test_make_backend_refuses_unknown_devices(device: str) -> None:
    with pytest.raises(BadInputError, match="unknown device"):
        make_backend(device, memory_limit_bytes=2**20)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_make_backend_cuda_without_cuda_is_device_unavailable(device: str) -> None:
    with pytest.raises(DeviceUnavailableError, match="--device cpu") as info:
        make_backend(device)
    assert info.value.code == "device_unavailable"


def test_storage_bytes_counts_each_storage_once() -> None:
    weight = torch.zeros(10, 10)
    tied = weight  # the same tensor twice (tied embeddings)
    view = weight[0]
    other = torch.zeros(5, dtype=torch.float64)
    assert storage_bytes([weight, tied, view, other]) == 400 + 40


def test_iter_tensors_walks_nested_optimizer_state() -> None:
    a, b, c = torch.zeros(1), torch.zeros(2), torch.zeros(3)
    state = {"p": {"step": a, "buffers": [b, (c, "not a tensor")]}, "lr": 0.1}
    assert [t.numel() for t in iter_tensors(state)] == [1, 2, 3]


def test_peak_reading_starts_empty() -> None:
    reading = PeakReading()
    assert (reading.allocated_bytes, reading.reserved_bytes, reading.alloc_retries) == (0, 0, 0)


def test_cpu_end_phase_records_each_phase_peak_and_restarts_from_what_is_live() -> None:
    backend = CpuBackend(10**6)
    with backend.track([]) as reading:
        kept = torch.zeros(1000)  # 4000 bytes, alive through both phases
        temporary = torch.zeros(2000)  # 8000 more in the first phase only
        del temporary
        backend.end_phase(reading, "accumulate")
        other = torch.zeros(500)  # 2000 more in the second phase
        del other
        backend.end_phase(reading, "optimizer")
        del kept
    assert reading.phases == {"accumulate": 12_000, "optimizer": 6_000}
    assert reading.allocated_bytes == 12_000


def test_cpu_end_phase_outside_track_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="inside track"):
        CpuBackend(10**6).end_phase(PeakReading(), "accumulate")
