"""Other tools' searches, re-implemented from their documented behaviour, and our own
``model`` search under its previous rules, for comparison in ``bench/search.py`` only.
Each returns the size that search would settle on, which need not be ``M*``; a trial's
cost (steps per trial) is the caller's probe settings.

:func:`check` holds each to its documented behaviour on curves whose ``M*`` is known;
``bench/search.py`` runs it before it measures anything.
"""

from __future__ import annotations

from collections.abc import Callable

from tuner.engine.search.core import ProbeFn, SearchOutcome, SearchRecorder
from tuner.engine.search.strategies import ModelRules, search_with_model

# The model search's rules before the current ones (see ``ModelRules``).
PREVIOUS_RULES = ModelRules(anchor_past_size_one=False, judge_open_aims_by_growth=False)


def lightning_power(
    probe: ProbeFn, *, cap: int, init_val: int = 2, max_trials: int = 25
) -> SearchOutcome:
    """Lightning ``mode="power"``: double from ``init_val`` until an OOM, keep the last success.

    An OOM before any success halves the size and tries again.
    """
    search = SearchRecorder(probe, cap)
    size, found = min(init_val, cap), 0
    for _ in range(max_trials):
        if search.run(size).fits:
            found = size
            if size >= cap:
                break
            size = min(2 * size, cap)
        elif found:
            break
        elif size == 1:
            break  # nothing left to halve to
        else:
            size //= 2
    return SearchOutcome(found, search.probes)


def lightning_binsearch(
    probe: ProbeFn, *, cap: int, init_val: int = 2, max_trials: int = 25, margin: float = 0.05
) -> SearchOutcome:
    """Lightning ``mode="binsearch"``: double until an OOM, bisect, then take ``margin`` off."""
    search = SearchRecorder(probe, cap)
    low, high, size, trials = 1, 0, min(init_val, cap), 0
    while True:
        if search.run(size).fits:
            trials += 1
            low = size
            if trials > max_trials or (high and high - low <= 1) or (not high and size >= cap):
                break
            size = (high + low) // 2 if high else min(2 * size, cap)
        else:
            high = size
            size = (high + low) // 2
            if high - low <= 1:
                break
    return SearchOutcome(max(1, int(size * (1 - margin))), search.probes)


def accelerate_shrink(probe: ProbeFn, *, cap: int, starting_batch_size: int = 128) -> SearchOutcome:
    """accelerate ``find_executable_batch_size``: start at 128, ×0.9 after each OOM."""
    search = SearchRecorder(probe, cap)
    size = min(starting_batch_size, cap)
    while size > 0 and not search.run(size).fits:
        size = int(size * 0.9)
    return SearchOutcome(size, search.probes)


def composer_halving(probe: ProbeFn, *, cap: int, batch_size: int | None = None) -> SearchOutcome:
    """Composer ``device_train_microbatch_size="auto"``: start at the batch size, halve on OOM."""
    search = SearchRecorder(probe, cap)
    size = min(batch_size or cap, cap)
    while size > 0 and not search.run(size).fits:
        size //= 2
    return SearchOutcome(size, search.probes)


def model_previous(probe: ProbeFn, *, cap: int, budget_bytes: int) -> SearchOutcome:
    """Our ``model`` search under its previous rules (the secant through size 1, open
    brackets judged by halving), to measure what the current rules changed."""
    return search_with_model(probe, cap=cap, budget_bytes=budget_bytes, rules=PREVIOUS_RULES)


BASELINES: dict[str, Callable[..., SearchOutcome]] = {
    "lightning-power": lightning_power,
    "lightning-binsearch": lightning_binsearch,
    "accelerate": accelerate_shrink,
    "composer": composer_halving,
}
