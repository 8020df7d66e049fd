"""After ``M*``: time micro batches at a few sizes, the speed curve the answer compares
splits by (:mod:`tuner.core.speeds`).

With a per-rank batch ``b`` asked, the sizes are those of the fewest-steps split and of
splits into 2, 4 and 8 times as many micro batches, ``⌈b / k₀⌉`` and ``⌊b / (2ʲ·k₀)⌋``
with ``k₀ = ⌈b / M*⌉``: the curve then covers every micro batch those splits run (it
interpolates between timed sizes and never extrapolates). Without one, ``M*`` and about
its halves, ``⌊M* / 2ʲ⌋``, so that a later question of any batch finds its sizes covered
down to an eighth of ``M*``.
"""

from __future__ import annotations

import math

from tuner.core.speeds import SpeedCurve
from tuner.engine.probe import Prober

# Rounds per size: three, so that a spread is seen at all.
ROUNDS = 3
# The fewest-steps split and splits into 2, 4 and 8 times as many micro batches.
HALVINGS = 3


def sizes_to_time(max_micro_batch_size: int, per_rank_batch_size: int | None = None) -> list[int]:
    """The micro batch sizes to time, smallest first (see the module's docstring)."""
    if per_rank_batch_size is None:
        top, steps = max_micro_batch_size, 1
        sizes = {top // 2**j for j in range(HALVINGS + 1)}
    else:
        b = per_rank_batch_size
        steps = math.ceil(b / min(max_micro_batch_size, b))
        sizes = {math.ceil(b / steps)} | {b // (steps * 2**j) for j in range(HALVINGS + 1)}
    return sorted(size for size in sizes if size >= 1)


def time_speeds(
    prober: Prober,
    max_micro_batch_size: int,
    per_rank_batch_size: int | None = None,
    *,
    rounds: int = ROUNDS,
) -> SpeedCurve:
    """The speed curve of ``prober``'s workload at the sizes :func:`sizes_to_time` picks."""
    speeds = prober.time_sizes(
        sizes_to_time(max_micro_batch_size, per_rank_batch_size), rounds=rounds
    )
    return speeds.model_copy(update={"per_rank_batch_size": per_rank_batch_size})
