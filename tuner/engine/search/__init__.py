"""Which micro batch size to probe next. Torch-free: a strategy sees only probe results.

Every strategy returns the largest size it saw fit. ``bisect`` and ``model`` finish only
when they have seen ``M*`` fit and ``M* + 1`` fail (or ``M*`` is the cap), so on a
workload whose memory grows with the batch they return the same exact ``M*``.
"""

from __future__ import annotations

from tuner.engine.search.core import PredictFn, ProbeFn, SearchOutcome, SearchRecorder
from tuner.engine.search.strategies import (
    STRATEGIES,
    Strategy,
    bisect_search,
    hinted_search,
    model_search,
    run_search,
)

__all__ = [
    "STRATEGIES",
    "PredictFn",
    "ProbeFn",
    "SearchOutcome",
    "SearchRecorder",
    "Strategy",
    "bisect_search",
    "hinted_search",
    "model_search",
    "run_search",
]
