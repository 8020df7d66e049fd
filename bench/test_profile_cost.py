"""What ``bench/profile_cost.py`` promises: each second counted once, in the innermost part
running, and a changed result told apart from a path that varies by itself. Checked with
the benchmarks, not by the test suite: ``python -m pytest bench/test_profile_cost.py``."""

from __future__ import annotations

import time
from typing import Any

import pytest

from bench.profile_cost import Clock, check_same_results


def test_each_second_counts_once_in_the_innermost_part() -> None:
    clock = Clock()
    started = time.perf_counter()
    with clock.part("rest"):
        time.sleep(0.02)
        with clock.part("dry run"):
            time.sleep(0.05)
            with clock.part("rest"):  # back out to the outer part's name
                time.sleep(0.01)
        time.sleep(0.02)
    total = time.perf_counter() - started
    assert sum(clock.seconds.values()) == pytest.approx(total, abs=0.005)
    assert 0.05 <= clock.seconds["dry run"] < 0.06 + 0.02
    assert clock.seconds["rest"] >= 0.05


def _run(m_star: int, peak: int) -> dict[str, Any]:
    return {"max_micro_batch_size": m_star, "peaks": [[m_star, peak, peak, True]]}


def test_a_changed_result_fails_and_a_varying_path_is_only_reported() -> None:
    runs = {
        "same": {"before": [_run(21, 100)] * 2, "after": [_run(21, 100)] * 2},
        "changed": {"before": [_run(21, 100)] * 2, "after": [_run(21, 101)] * 2},
        "varies": {"before": [_run(22, 90), _run(23, 95)], "after": [_run(23, 95)] * 2},
    }
    differing, unrepeatable = check_same_results(runs)
    assert [line.split(":")[0] for line in differing] == ["changed"]
    assert [line.split(":")[0] for line in unrepeatable] == ["varies"]
