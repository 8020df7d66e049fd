"""A search that starts from a predicted ``M*`` (another sequence length's fit aims it).

With a good guess ``g`` it takes two probes: ``g`` fits and ``g + 1`` does not, or ``g``
does not and ``g − 1`` fits. Otherwise the bracket those probes left is handed to the
model search's rules (:func:`continue_with_model`), so the answer is as exact as the
model search's: ``M*`` fits and ``M* + 1`` does not (or ``M*`` is the cap).
"""

from __future__ import annotations

from tuner.engine.search.core import ProbeFn, SearchOutcome, SearchRecorder
from tuner.engine.search.strategies import continue_with_model


def hinted_search(probe: ProbeFn, *, cap: int, budget_bytes: int, guess: int) -> SearchOutcome:
    """Probe ``guess`` (clamped into ``[1, cap]``), then its neighbour towards the boundary.

    A guess more than one too high leaves no fitting size to aim from: sizes are halved
    from the smallest failure until one fits (the model's aim is good from a size near
    the boundary, where activations dominate), then the model search goes on from there.
    """
    search = SearchRecorder(probe, cap)
    size = min(max(guess, 1), cap)
    if search.run(size).fits:
        if size < cap:
            search.run(size + 1)
    elif size > 1:
        search.run(size - 1)
    while search.lo == 0 and not search.settled:
        search.run(search.hi // 2)
    return continue_with_model(search, budget_bytes=budget_bytes)
