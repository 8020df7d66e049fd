"""microbatch-tuner: measure the largest micro batch that fits, and train with it.

The package root stays torch-free so that ``tuner.plan`` and ``tuner.client`` import in
the service image; names that need torch are loaded on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from tuner.errors import (
    BadInputError,
    DeviceUnavailableError,
    NothingFitsError,
    TunerError,
    WorkloadError,
)
from tuner.plan import Recommendation, recommend
from tuner.results import AffineFit, MemoryBreakdown, ProbeResult, Profile

if TYPE_CHECKING:
    from tuner.profiler import profile_workload
    from tuner.workload import Workload, load_workload

__all__ = [
    "AffineFit",
    "BadInputError",
    "DeviceUnavailableError",
    "MemoryBreakdown",
    "NothingFitsError",
    "ProbeResult",
    "Profile",
    "Recommendation",
    "TunerError",
    "Workload",
    "WorkloadError",
    "load_workload",
    "profile_workload",
    "recommend",
]
__version__ = "0.1.0"

_TORCH_EXPORTS = {
    "Workload": "tuner.workload",
    "load_workload": "tuner.workload",
    "profile_workload": "tuner.profiler",
}


def __getattr__(name: str) -> Any:
    module = _TORCH_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tuner' has no attribute {name!r}")
    return getattr(import_module(module), name)
