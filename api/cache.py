"""Answers kept in the process, each under the store generation it was computed at.

An entry is returned only while the store's generation is still the one it was stored
with, so a cached answer is never older than the last write, from any process.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class GenerationCache(Generic[V]):
    """A bounded least-recently-used map whose entries expire with the generation.

    Used from the event loop only (routes put after their threadpool work returns), so it
    needs no lock.
    """

    def __init__(self, max_entries: int = 50_000) -> None:
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
