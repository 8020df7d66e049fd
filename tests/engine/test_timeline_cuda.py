"""The CUDA path of the memory timeline, with the CUDA device stood in.

No GPU exists on this machine, so, as in ``test_backend_cuda.py``, the handful of
``torch.cuda`` functions the backend calls are replaced by a small fake allocator, which
here also keeps torch's memory history (``torch.cuda.memory._record_memory_history`` and
``_snapshot``) in the shape a real snapshot has: trace entries of ``alloc``,
``free_requested`` and ``free_completed`` with the size asked for and Python frames, and
statistics that count whole 512-byte blocks. That is the only simulation: the backend's
and the timeline's code under test is the real one."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.engine.test_backend_cuda import FakeAllocator
from tuner.engine.backends.cuda import CudaBackend
from tuner.engine.timeline import CUDA_HISTORY_EVENTS, cuda_block_size

MiB = 2**20


class FakeHistory(FakeAllocator):
    """The fake allocator, with allocations and frees recorded as torch records them."""

    def __init__(self) -> None:
        super().__init__()
        self.allocated = 0
        self.counts = {"allocation.all.allocated": 0, "allocation.all.freed": 0}
        self.recording: str | None = None
        self.max_entries = 0
        self.trace: list[dict[str, Any]] = []
        self.blocks: dict[int, int] = {}
        self.next_address = 0x7000_0000

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        super().install(monkeypatch)
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "memory_allocated", lambda _device=None: self.allocated)
        monkeypatch.setattr(
            cuda,
            "memory_stats",
            lambda _device=None: {"num_alloc_retries": self.retries, **self.counts},
        )
        monkeypatch.setattr(cuda.memory, "_record_memory_history", self._record)
        monkeypatch.setattr(cuda.memory, "_snapshot", self._snapshot)
        monkeypatch.setattr(
            torch._C, "_cuda_isHistoryEnabled", lambda: self.recording is not None, raising=False
        )

    def _record(self, enabled: str | None = "all", **options: Any) -> None:
        self.recording = enabled
        if enabled is not None:
            self.options = options
            self.max_entries = options["max_entries"]
            if options.get("clear_history"):
                self.trace = []

    def _snapshot(self, _device: object = None) -> dict[str, Any]:
        return {"segments": [], "device_traces": [list(self.trace)]}

    def _entry(self, action: str, address: int, size: int, frames: list[dict[str, Any]]) -> None:
        if self.recording is None:
            return
        self.trace.append(
            {"action": action, "addr": address, "size": size, "stream": 0, "frames": frames}
        )
        del self.trace[: max(0, len(self.trace) - self.max_entries)]  # the ring buffer

    def alloc(self, size: int, where: str) -> int:
        address, self.next_address = self.next_address, self.next_address + (1 << 24)
        block = cuda_block_size(size)
        self.blocks[address] = block
        self.allocated += block
        self.counts["allocation.all.allocated"] += 1
        self.run(allocated=self.allocated, reserved=max(self.reserved, self.allocated))
        frames = [
            {"filename": "/site-packages/torch/nn/modules/linear.py", "line": 125, "name": where}
        ]
        self._entry("alloc", address, size, frames)  # the trace keeps the size asked for
        return address

    def free(self, address: int) -> None:
        block = self.blocks.pop(address)
        self.allocated -= block
        self.counts["allocation.all.freed"] += 1
        self._entry("free_requested", address, block, [])
        self._entry("free_completed", address, block, [])


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeHistory:
    allocator = FakeHistory()
    allocator.install(monkeypatch)
    return allocator


def one_step(backend: CudaBackend, fake: FakeHistory, reading: Any) -> None:
    """Two micro batches and an optimizer step, with phases ended as the probe ends them."""
    for _ in range(2):
        acts = [fake.alloc(3 * MiB + 100, "forward"), fake.alloc(MiB, "forward")]
        backend.end_phase(reading, "forward")
        grad = fake.alloc(2 * MiB, "backward")
        for address in acts:
            fake.free(address)
        fake.free(grad)
        backend.end_phase(reading, "backward")
    backend.end_phase(reading, "accumulate")
    temp = fake.alloc(5 * MiB, "step")
    fake.free(temp)
    backend.end_phase(reading, "optimizer")


def test_the_timeline_replays_torchs_memory_history(fake: FakeHistory) -> None:
    fake.allocated = 40 * MiB  # weights and optimizer state, live before the step
    backend = CudaBackend()
    with backend.track([], timeline=True) as reading:
        assert fake.recording == "all"
        assert fake.options["context"] == "alloc"
        assert fake.options["stacks"] == "python"
        one_step(backend, fake, reading)
    assert fake.recording is None  # the history is off again
    timeline = reading.timeline
    assert timeline is not None
    assert timeline.source == "cuda-memory-history"
    assert timeline.live_bytes[0] == 40 * MiB
    # Sizes rounded as the allocator rounds them: the peak is what its statistics count.
    assert (
        timeline.peak_bytes
        == reading.allocated_bytes
        == 40 * MiB + cuda_block_size(3 * MiB + 100) + 3 * MiB
    )
    assert timeline.live_bytes[-1] == 40 * MiB
    assert [s.label for s in timeline.phases] == [
        "forward 1",
        "backward 1",
        "forward 2",
        "backward 2",
        "optimizer",
    ]
    assert [(s.start, s.end) for s in timeline.phases] == [
        (0, 2),
        (2, 6),
        (6, 8),
        (8, 12),
        (12, 14),
    ]
    assert timeline.length == 14  # allocations and frees; free_completed is no change
    assert "forward (linear.py:125)" in timeline.operators


def test_a_history_that_dropped_events_records_no_timeline(
    fake: FakeHistory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tuner.engine.backends.cuda.CUDA_HISTORY_EVENTS", 10)
    backend = CudaBackend()
    with backend.track([], timeline=True) as reading:
        one_step(backend, fake, reading)
    assert reading.timeline is None  # its oldest events were overwritten: it would be wrong
    assert reading.allocated_bytes > 0  # the peak is still measured
    assert CUDA_HISTORY_EVENTS >= 100_000


def test_the_history_is_turned_off_when_the_step_fails(fake: FakeHistory) -> None:
    backend = CudaBackend()

    def step_that_runs_out() -> None:
        with backend.track([], timeline=True):
            fake.alloc(MiB, "forward")
            raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(torch.OutOfMemoryError):
        step_that_runs_out()
    assert fake.recording is None


def test_without_a_timeline_no_history_is_recorded(fake: FakeHistory) -> None:
    backend = CudaBackend()
    with backend.track([]) as reading:
        one_step(backend, fake, reading)
    assert fake.recording is None
    assert fake.trace == []
    assert reading.timeline is None


def test_a_history_the_user_records_is_left_alone(fake: FakeHistory) -> None:
    fake._record("all", max_entries=1_000, context="all", stacks="all")
    fake.alloc(MiB, "the user's own")
    backend = CudaBackend()
    with backend.track([], timeline=True) as reading:
        one_step(backend, fake, reading)
    assert reading.timeline is None  # theirs is not cleared, nor turned off
    assert fake.recording == "all"
    assert fake.options["context"] == "all"
    assert fake.trace[0]["frames"][0]["name"] == "the user's own"
