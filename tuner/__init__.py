"""microbatch-tuner: measure the largest micro batch that fits, and train with it.

The public API, re-exported from the packages by role (``core``, ``engine``, ``train``,
``client``). The root stays torch-free so that it imports in the service image: the core's
names load with it, the others on first use (the engine and the loop need torch; the
client needs the service's schemas, which themselves stand on the core).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from tuner.core import __version__
from tuner.core.errors import (
    BadInputError,
    DeviceUnavailableError,
    NothingFitsError,
    TunerError,
    WorkloadError,
)
from tuner.core.parallel import Parallel
from tuner.core.plan import Recommendation, recommend
from tuner.core.results import AffineFit, MemoryBreakdown, ProbeResult, Profile

if TYPE_CHECKING:
    from tuner.client import TunerClient
    from tuner.engine.backends import make_backend
    from tuner.engine.profiler import profile_workload
    from tuner.engine.workload import Workload, load_workload
    from tuner.train.accumulate import Accumulator, StepReport
    from tuner.train.planning import plan_training

__all__ = [
    "Accumulator",
    "AffineFit",
    "BadInputError",
    "DeviceUnavailableError",
    "MemoryBreakdown",
    "NothingFitsError",
    "Parallel",
    "ProbeResult",
    "Profile",
    "Recommendation",
    "StepReport",
    "TunerClient",
    "TunerError",
    "Workload",
    "WorkloadError",
    "__version__",
    "load_workload",
    "make_backend",
    "plan_training",
    "profile_workload",
    "recommend",
]

_LAZY_EXPORTS = {
    "Workload": "tuner.engine.workload",
    "load_workload": "tuner.engine.workload",
    "make_backend": "tuner.engine.backends",
    "profile_workload": "tuner.engine.profiler",
    "Accumulator": "tuner.train.accumulate",
    "StepReport": "tuner.train.accumulate",
    "plan_training": "tuner.train.planning",
    "TunerClient": "tuner.client",
}


def __getattr__(name: str) -> Any:
    module = _LAZY_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tuner' has no attribute {name!r}")
    return getattr(import_module(module), name)
