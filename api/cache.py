"""Token checks kept in the process, each under the store generation it was made at.

An entry is returned only while the store's generation is still the one it was stored
with, so a cached check is never older than the last write, from any process.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from functools import partial
from typing import Generic, TypeVar

V = TypeVar("V")


class GenerationCache(Generic[V]):
    """A bounded least-recently-used map whose entries expire with the generation.

    Bounded in entries, and so in bytes, because of what it holds: the service keeps the
    principal of each token the store authenticated (``api.deps``), keyed by the token's
    SHA-256 digest (64 characters, whatever the request sent). A token the store refuses
    adds nothing, and the principal's name and scopes come from the store's columns
    (``String(200)``, ``String(100)``), not from the request: at most one entry per stored
    token, each under 1 KiB, so at most ``max_entries`` × 1 KiB (about 10 MiB). Do not
    keep answers or anything else a request can size in it: they would need a bound in
    bytes.

    Used from the event loop only (routes put after their threadpool work returns), so it
    needs no lock.
    """

    def __init__(self, max_entries: int = 10_000) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[Hashable, tuple[int, V]] = OrderedDict()

    def get(self, key: Hashable, generation: int) -> V | None:
        entry = self._entries.get(key)
        if entry is None or entry[0] != generation:
            return None
        self._entries.move_to_end(key)
        return entry[1]

    def put(self, key: Hashable, generation: int, value: V) -> None:
        self._entries[key] = (generation, value)
        self._entries.move_to_end(key)
        if len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every entry (tests and benchmarks that time or compare cold answers)."""
        self._entries.clear()


class SingleFlight(Generic[V]):
    """Concurrent callers asking for the same key share one computation.

    After a write raises the generation, every connection of a busy server misses the
    cache at once; without this, fifty requests would each check the same token (and
    record its use) in fifty threads. Used from the event loop only.
    """

    def __init__(self) -> None:
        self._running: dict[Hashable, asyncio.Task[V]] = {}

    async def run(self, key: Hashable, compute: Callable[[], Awaitable[V]]) -> V:
        task = self._running.get(key)
        if task is None:
            task = asyncio.ensure_future(compute())
            self._running[key] = task
            task.add_done_callback(partial(self._finished, key))
        # Shielded: a caller that goes away does not cancel the others' computation.
        return await asyncio.shield(task)

    def _finished(self, key: Hashable, task: asyncio.Task[V]) -> None:
        self._running.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved here too, in case every caller went away
