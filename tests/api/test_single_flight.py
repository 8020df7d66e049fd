"""Concurrent callers of one key share one computation, its result and its error."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest

from api.cache import SingleFlight

T = TypeVar("T")


def run(scenario: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run`` on a thread of its own: the browser tests' session-wide Playwright
    keeps an event loop running on the main thread."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(scenario())).result()


def test_concurrent_callers_share_one_computation_and_later_ones_compute_again() -> None:
    async def scenario() -> tuple[list[int], list[int], int]:
        flight: SingleFlight[int] = SingleFlight()
        calls: list[int] = []

        async def compute() -> int:
            calls.append(1)
            await asyncio.sleep(0.02)
            return len(calls)

        shared = await asyncio.gather(*(flight.run("k", compute) for _ in range(20)))
        other = await asyncio.gather(flight.run("other", compute))
        later = await flight.run("k", compute)
        return list(shared), list(other), later

    shared, other, later = run(scenario)
    assert shared == [1] * 20  # twenty callers, one computation
    assert other == [2]  # another key is its own computation
    assert later == 3  # once finished, the key is computed afresh


def test_an_error_reaches_every_caller() -> None:
    async def scenario() -> list[BaseException | int]:
        flight: SingleFlight[int] = SingleFlight()

        async def fail() -> int:
            await asyncio.sleep(0.01)
            raise LookupError("no such token")

        return await asyncio.gather(
            *(flight.run("k", fail) for _ in range(5)), return_exceptions=True
        )

    outcomes = run(scenario)
    assert len(outcomes) == 5
    assert all(isinstance(outcome, LookupError) for outcome in outcomes)


def test_a_caller_that_goes_away_does_not_cancel_the_others() -> None:
    async def scenario() -> int:
        flight: SingleFlight[int] = SingleFlight()

        async def compute() -> int:
            await asyncio.sleep(0.05)
            return 7

        leaving = asyncio.ensure_future(flight.run("k", compute))
        staying = asyncio.ensure_future(flight.run("k", compute))
        await asyncio.sleep(0.01)
        leaving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leaving
        return await staying

    assert run(scenario) == 7
