"""Curves measured once at several sequence lengths, and the searches of ``tuner profile
--seq-lens`` replayed on them against any budget: tracked CPU memory is deterministic, so a
curve scanned with the limit lifted answers every limit. ``tests/engine/test_length_replay.py``
holds the replays to the truth; ``bench/seqlen.py`` reports them."""

from __future__ import annotations

import math
from itertools import pairwise

from tuner.core.results import ProbeResult, Profile
from tuner.engine.backends import CpuBackend
from tuner.engine.lengths import search_length
from tuner.engine.probe import Prober
from tuner.engine.workload import load_workload

Curves = dict[int, dict[int, ProbeResult]]  # seq_len → micro batch → probe, limit lifted


def scan_lengths(target: str, options: dict[str, object], sizes: dict[int, int]) -> Curves:
    """Every micro batch from 1 to ``sizes[s]`` at each length ``s``, measured whole (the
    limit lifted): tracked CPU memory is deterministic, so these curves answer any limit."""
    curves: Curves = {}
    for seq_len, scan_to in sorted(sizes.items()):
        workload = load_workload(target, {**options, "seq_len": seq_len})
        with Prober(workload, CpuBackend(2**40), headroom=0.0) as prober:
            curves[seq_len] = {m: prober(m, enforce_capacity=False) for m in range(1, scan_to + 1)}
    return curves


def replay_budgets(curves: Curves) -> list[int]:
    """A budget halfway between every two consecutive footprints measured at any length,
    as long as every length's curve reaches past it (so its true ``M*`` is known)."""
    reach = min(max(footprint(r) for r in curve.values()) for curve in curves.values())
    peaks = sorted({footprint(r) for curve in curves.values() for r in curve.values()})
    return [(a + b) // 2 for a, b in pairwise(peaks) if b <= reach]


def footprint(result: ProbeResult) -> int:
    assert result.footprint_bytes is not None
    return result.footprint_bytes


def true_max(curve: dict[int, ProbeResult], budget: int) -> int:
    return max((m for m, r in curve.items() if footprint(r) <= budget), default=0)


def replay_family(
    curves: Curves, budget: int, template: Profile, *, headroom: float
) -> tuple[list[Profile], list[str]]:
    """Every length searched as ``--seq-lens`` does (:func:`search_length`), shortest
    first, on the recorded curves against ``budget``; and what it reported. Above the
    capacity ``budget / (1 − headroom)`` a probe runs out of memory and leaves no peak, as
    the CPU backend's does; between the two it fails with its peak."""
    capacity = math.ceil(budget / (1 - headroom))
    profiles: list[Profile] = []
    notes: list[str] = []
    for seq_len, curve in sorted(curves.items()):

        def probe(m: int, curve: dict[int, ProbeResult] = curve) -> ProbeResult:
            if footprint(curve[m]) > capacity:
                return ProbeResult(micro_batch_size=m, fits=False, oom=True)
            return curve[m].model_copy(update={"fits": footprint(curve[m]) <= budget})

        outcome = search_length(
            probe,
            cap=max(curve),
            budget_bytes=budget,
            earlier=profiles,
            seq_len=seq_len,
            report=notes.append,
        )
        workload = template.workload.model_copy(update={"seq_len": seq_len})
        profiles.append(
            template.model_copy(
                update={
                    "workload": workload,
                    "workload_key": f"{seq_len:024d}",
                    "budget_bytes": budget,
                    "headroom": headroom,
                    "max_micro_batch_size": outcome.max_micro_batch_size,
                    "probes": outcome.probes,
                }
            )
        )
    return profiles, notes
