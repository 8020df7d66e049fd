"""Per-token limits on writes, so that one client cannot crowd out the others.

The counting is the ``limits`` library's moving window, kept in the process's memory:
one entry per token that wrote recently, so it stays small however many requests come.
Each service process counts on its own, so with ``--workers N`` a token may reach N
times the rate; reads are never limited (they are cached and cheap).
"""

from __future__ import annotations

import math
import time

from limits import RateLimitItem, parse, storage, strategies

from api.security import Principal
from tuner.core.errors import BadInputError, RateLimitedError

DEFAULT_WRITE_RATE = "600/minute"


def parse_rate(text: str | None) -> RateLimitItem | None:
    """``"600/minute"`` (``limits``' notation), or ``None``/``"none"`` for no limit."""
    if text is None or text.strip().lower() in ("", "none", "off"):
        return None
    try:
        return parse(text)
    except ValueError:
        raise BadInputError(
            f"write rate limit {text!r} is not a rate: give e.g. '600/minute', "
            "'20/second' or 'none'"
        ) from None


class WriteLimiter:
    """Counts each token's writes; refuses one over the rate with how long to wait."""

    def __init__(self, rate: str | None) -> None:
        self.rate = rate
        self.item = parse_rate(rate)
        self._window = strategies.MovingWindowRateLimiter(storage.MemoryStorage())

    def check(self, principal: Principal) -> None:
        if self.item is None or principal.token_id is None:
            return
        key = str(principal.token_id)
        if self._window.hit(self.item, "writes", key):
            return
        reset = self._window.get_window_stats(self.item, "writes", key).reset_time
        wait = max(1, math.ceil(reset - time.time()))
        raise RateLimitedError(
            f"token {principal.name!r} has made {self.rate} writes: wait {wait} s, or run "
            "the service with a higher TUNER_WRITE_RATE_LIMIT",
            retry_after_s=wait,
        )
