"""A profile measured for real whose probe at M* carries its memory timeline, shared by the
service's and the dashboard's tests (measured once per test process: a search of a tiny
model on the CPU tracker takes a few seconds)."""

from __future__ import annotations

from functools import cache

from tests.variant_workloads import stack
from tuner.core.results import Profile
from tuner.engine.backends import CpuBackend
from tuner.engine.profiler import profile_workload

MiB = 2**20


@cache
def measured_profile() -> Profile:
    """``stack(layers=2)`` searched against 2 MiB: M* below the cap, a timeline at M*."""
    profile = profile_workload(stack(layers=2), CpuBackend(2 * MiB), size_cap=64)
    at = profile.probe_at(profile.max_micro_batch_size)
    if at is None or at.timeline is None:
        raise AssertionError("the search must keep a timeline at M*")
    return profile
