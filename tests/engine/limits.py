"""Memory limits that put a real workload's boundary exactly where a test wants it."""

from __future__ import annotations

import math

from tuner.engine.backends import CpuBackend
from tuner.engine.probe import Prober
from tuner.engine.workload import Workload

HEADROOM = 0.05


def limit_with_m_star(workload: Workload, m_star: int) -> int:
    """The CPU limit halfway between the footprints of ``m_star`` and ``m_star + 1``, so
    that with 5% headroom ``m_star`` fits and ``m_star + 1`` does not."""
    with Prober(workload, CpuBackend(2**40), headroom=HEADROOM) as measure:
        at, above = (
            measure(m, enforce_capacity=False).footprint_bytes for m in (m_star, m_star + 1)
        )
    assert at is not None
    assert above is not None
    assert at < above
    return math.ceil((at + above) / 2 / (1 - HEADROOM))
