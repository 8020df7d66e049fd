"""The profile page's per-block bars: activations saved for backward by each top-level
block at M*, as the probe recorded them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockBar:
    name: str
    bytes: int
    width: float  # percent of the longest bar
    share: float  # fraction of all saved bytes


def block_bars(by_block: dict[str, int]) -> list[BlockBar]:
    """One bar per block, in model order; the heaviest block's bar is full width."""
    largest = max(by_block.values(), default=0)
    total = sum(by_block.values())
    if largest <= 0:
        return []
    return [
        BlockBar(name, size, round(100 * size / largest, 2), size / total)
        for name, size in by_block.items()
    ]
