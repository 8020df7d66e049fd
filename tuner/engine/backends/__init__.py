"""Memory backends: where a probe runs and how its peak is read."""

from __future__ import annotations

from tuner.core.errors import BadInputError
from tuner.engine.backends.base import Backend, PeakReading, iter_tensors, storage_bytes
from tuner.engine.backends.cpu import CpuBackend, LiveBytesTracker
from tuner.engine.backends.oom import is_out_of_memory

__all__ = [
    "Backend",
    "CpuBackend",
    "LiveBytesTracker",
    "PeakReading",
    "is_out_of_memory",
    "iter_tensors",
    "make_backend",
    "storage_bytes",
]


def make_backend(
    device: str, *, memory_limit_bytes: int | None = None, count_all_threads: bool = False
) -> Backend:
    """``cpu`` (needs a limit), ``cuda`` or ``cuda:N`` (a limit there emulates a smaller card).
    ``count_all_threads``: on the CPU, also count what other threads allocate (a gloo rank)."""
    kind, _, index = device.partition(":")
    if kind == "cpu":
        if memory_limit_bytes is None:
            raise BadInputError(
                "--device cpu needs --memory-limit, the memory to fit in, e.g. --memory-limit 2GiB"
            )
        return CpuBackend(memory_limit_bytes, count_all_threads=count_all_threads)
    if kind == "cuda" and (not index or index.isdigit()):
        from tuner.engine.backends.cuda import CudaBackend

        return CudaBackend(int(index) if index else None, limit_bytes=memory_limit_bytes)
    raise BadInputError(f"unknown device {device!r}: use cpu, cuda or cuda:N")
