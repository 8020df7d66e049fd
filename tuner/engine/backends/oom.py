"""The one predicate that decides whether an exception means "out of memory"."""

from __future__ import annotations

import torch

# Allocation failures that libraries report as a plain RuntimeError rather than
# torch.OutOfMemoryError. Anything else is a bug in the workload and must propagate.
_OOM_MESSAGES = (
    "CUDA out of memory",
    "CUDA error: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUFFT_ALLOC_FAILED",
    "HIP out of memory",
    "DefaultCPUAllocator: can't allocate memory",
    "DefaultCPUAllocator: not enough memory",
)


def is_out_of_memory(exc: BaseException) -> bool:
    """True for torch.OutOfMemoryError and the known cuBLAS/cuDNN/allocator failure forms."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    if isinstance(exc, RuntimeError):
        message = str(exc)
        return any(marker in message for marker in _OOM_MESSAGES)
    return False
