"""Search strategies and baselines against exhaustive truth, on the example workloads.

1. For each workload, every micro batch size from 1 to N is probed once with the CPU
   limit lifted. Tracked CPU memory is deterministic, so this curve gives the true
   ``M*`` for any limit.
2. Memory limits are chosen so that ``M*`` takes target values from 1 to over 1000.
   For each, every strategy and baseline runs for real against that limit: probes,
   training steps, wall time, and the size found against the truth.
3. Every size is also predicted by a dry run on fake tensors (``tuner.engine.dry_run``),
   and the predictions are compared with the measured curve, size by size.
4. ``model`` (aimed by the dry run), ``model-no-dry-run`` (the same rules without it),
   ``model-previous`` (the model search under its previous rules) and ``bisect`` are
   replayed on the recorded curves for every budget between two consecutive sizes, to
   show that each is exact every time and how many probes it takes. ``model`` is also
   replayed with predictions made wrong on purpose, as a GPU's would be (its allocator's
   cache and rounding, kernel workspaces): every prediction 3% low, 3% high, or short by a
   constant of 5% of the budget.

Besides the examples, two workloads that only this benchmark uses (``bench/workloads.py``):
a GRU sequence model and a small vision transformer.

All strategies share one probe (2 warm-up steps, 1 measured step of 2 micro batches,
1 timed step), so the differences come from the search policy alone.

Run: ``python bench/search.py`` (about 20 minutes on 2 cores), or ``--quick`` for a
smoke run that writes nothing. ``--curves DIR --results DIR --only gpt,cnn`` measures
some workloads in one process (several can run side by side); a last run with the same
directories and no ``--only`` writes the section from them all. Every run first runs
``bench/test_baselines.py``: the baselines must behave as their tools document before
they are compared.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.baselines import BASELINES, model_previous
from bench.common import machine_line, markdown_table, write_section
from tuner.core.results import ProbeResult
from tuner.engine.backends import CpuBackend
from tuner.engine.dry_run import DryRun
from tuner.engine.probe import Prober
from tuner.engine.search import STRATEGIES, PredictFn, SearchOutcome, model_search
from tuner.engine.workload import load_workload

HEADROOM = 0.05
SIZE_CAP = 4096


@dataclass(frozen=True)
class Case:
    label: str
    target: str
    options: dict[str, object]
    scan_to: int
    targets: list[int]


CASES = [
    Case("gpt", "examples.gpt:workload", {"layers": 2}, 31, [1, 6, 30]),
    Case("cnn", "examples.cnn:workload", {"width": 16}, 130, [3, 20, 110]),
    Case(
        "mlp",
        "examples.mlp:workload",
        {"in_features": 32, "hidden": 64, "layers": 2},
        1100,
        [60, 400, 1000],
    ),
    Case("gru", "bench.workloads:gru", {}, 80, [2, 15, 60]),
    Case("vit", "bench.workloads:vit", {}, 60, [2, 12, 45]),
]
QUICK_CASES = [
    Case("gpt", "examples.gpt:workload", {"layers": 1}, 8, [1, 5]),
    Case("mlp", "examples.mlp:workload", {"in_features": 32, "hidden": 64, "layers": 2}, 40, [30]),
    Case("gru", "bench.workloads:gru", {"seq_len": 4}, 8, [5]),
]


def model_without_dry_run(
    probe: Callable[[int], ProbeResult], *, cap: int, budget_bytes: int
) -> SearchOutcome:
    return model_search(probe, cap=cap, budget_bytes=budget_bytes)


# Searches told the budget: ours, under the current and the previous rules. Only ``model``
# takes predictions (a real run gives it a dry run, a replay the dry run's curve).
AIMED: dict[str, Callable[..., SearchOutcome]] = {
    **STRATEGIES,
    "model-no-dry-run": model_without_dry_run,
    "model-previous": model_previous,
}
PREDICTED = {"model"}
# Predictions made wrong on purpose, as a GPU's are: (label, factor, constant as a share
# of the budget) applied to every predicted peak.
DISTORTIONS = [("3% low", 0.97, 0.0), ("3% high", 1.03, 0.0), ("5% of budget short", 1.0, -0.05)]

Search = Callable[..., SearchOutcome]


def _searches() -> dict[str, Search]:
    return {**AIMED, **BASELINES}


def kept_or_scanned(
    path: Path | None, scan_to: int, scan: Callable[[], dict[int, ProbeResult]]
) -> dict[int, ProbeResult]:
    """Sizes 1 to ``scan_to`` read from ``path`` when it covers them, else ``scan()``
    written there (a scan is most of the run's time)."""
    if path is not None and path.exists():
        stored = {
            int(m): ProbeResult.model_validate(r) for m, r in json.loads(path.read_text()).items()
        }
        if all(m in stored for m in range(1, scan_to + 1)):
            return {m: stored[m] for m in range(1, scan_to + 1)}
    curve = scan()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({m: r.model_dump(mode="json") for m, r in curve.items()}))
    return curve


def scan_curve(case: Case, saved: Path | None = None) -> dict[int, ProbeResult]:
    """Every size from 1 to ``scan_to``, measured whole (limit lifted); kept as
    ``<label>.json`` in the directory ``saved``."""

    def scan() -> dict[int, ProbeResult]:
        workload = load_workload(case.target, case.options)
        with Prober(workload, CpuBackend(2**40), headroom=HEADROOM) as prober:
            return {m: prober(m, enforce_capacity=False) for m in range(1, case.scan_to + 1)}

    path = None if saved is None else saved / f"{case.label}.json"
    return kept_or_scanned(path, case.scan_to, scan)


def scan_predictions(case: Case, saved: Path | None = None) -> dict[int, ProbeResult]:
    """The dry run's prediction of every size from 1 to ``scan_to``; kept as
    ``<label>.dry.json`` in the directory ``saved``."""

    def scan() -> dict[int, ProbeResult]:
        workload = load_workload(case.target, case.options)
        curve: dict[int, ProbeResult] = {}
        with DryRun(workload, CpuBackend(2**40), headroom=HEADROOM) as dry:
            for m in range(1, case.scan_to + 1):
                predicted = dry(m)
                if predicted is None:
                    raise RuntimeError(f"{case.label}: the dry run could not predict size {m}")
                curve[m] = predicted
        return curve

    path = None if saved is None else saved / f"{case.label}.dry.json"
    return kept_or_scanned(path, case.scan_to, scan)


def time_predictions(case: Case) -> tuple[float, float]:
    """Seconds per prediction of a fresh dry run (its one warm-up included) and per real
    probe, at the same three sizes (1, the middle and the end of the scan), side by side."""
    sizes = [1, max(1, case.scan_to // 2), case.scan_to]
    workload = load_workload(case.target, case.options)
    backend = CpuBackend(2**40)
    dry_s = probe_s = 0.0
    with (
        Prober(workload, backend, headroom=HEADROOM) as prober,
        DryRun(workload, backend, headroom=HEADROOM) as dry,
    ):
        for m in sizes:
            started = time.perf_counter()
            dry(m)
            dry_s += time.perf_counter() - started
            started = time.perf_counter()
            prober(m, enforce_capacity=False)
            probe_s += time.perf_counter() - started
    return dry_s / len(sizes), probe_s / len(sizes)


def same_peaks(predicted: ProbeResult, measured: ProbeResult) -> bool:
    return (
        predicted.phase_peaks_bytes == measured.phase_peaks_bytes
        and predicted.peak_reserved_bytes == measured.peak_reserved_bytes
    )


def distorted(
    predictions: dict[int, ProbeResult], factor: float, constant: int
) -> dict[int, ProbeResult]:
    """Every predicted peak times ``factor`` plus ``constant`` bytes."""

    def moved(peak: int) -> int:
        return max(1, int(peak * factor) + constant)

    out = {}
    for m, r in predictions.items():
        assert r.peak_allocated_bytes is not None
        assert r.peak_reserved_bytes is not None
        out[m] = r.model_copy(
            update={
                "peak_allocated_bytes": moved(r.peak_allocated_bytes),
                "peak_reserved_bytes": moved(r.peak_reserved_bytes),
                "phase_peaks_bytes": {k: moved(v) for k, v in r.phase_peaks_bytes.items()},
            }
        )
    return out


def footprint(result: ProbeResult) -> int:
    assert result.footprint_bytes is not None
    return result.footprint_bytes


def truth(curve: dict[int, ProbeResult], budget: int) -> int:
    return max((m for m, r in curve.items() if footprint(r) <= budget), default=0)


def limit_for(curve: dict[int, ProbeResult], target: int) -> int:
    """A limit whose budget lies halfway between the footprints of ``target`` and ``target+1``."""
    budget = (footprint(curve[target]) + footprint(curve[target + 1])) // 2
    return math.ceil(budget / (1 - HEADROOM))


def run_real(case: Case, limit: int, name: str, search: Search) -> tuple[SearchOutcome, float]:
    backend = CpuBackend(limit)
    started = time.perf_counter()
    workload = load_workload(case.target, case.options)
    with (
        Prober(workload, backend, headroom=HEADROOM) as prober,
        DryRun(workload, backend, headroom=HEADROOM) as dry,
    ):
        kwargs: dict[str, object] = {"cap": SIZE_CAP}
        if name in AIMED:
            kwargs["budget_bytes"] = prober.budget_bytes
        if name in PREDICTED:
            kwargs["predict"] = dry
        outcome = search(prober, **kwargs)
    return outcome, time.perf_counter() - started


def verdict(found: int, true_size: int) -> str:
    if found == true_size:
        return "exact"
    if found < true_size:
        return f"{true_size - found} below ({found / true_size:.0%})"
    return f"{found - true_size} ABOVE: would run out of memory"


def replay(
    curve: dict[int, ProbeResult],
    name: str,
    predictions: dict[int, ProbeResult] | None = None,
    distortion: tuple[float, float] | None = None,
) -> tuple[int, int, list[int]]:
    """Run ``name`` on the recorded curve for every budget between consecutive sizes, with
    ``predictions`` (for ``model``), distorted by ``(factor, constant share of budget)``."""
    sizes = sorted(curve)
    exact = total = 0
    probes: list[int] = []
    for target in sizes[:-1]:
        if footprint(curve[target + 1]) <= footprint(curve[target]):
            continue  # no budget separates these two sizes
        budget = (footprint(curve[target]) + footprint(curve[target + 1])) // 2
        capacity = math.ceil(budget / (1 - HEADROOM))

        def probe(m: int, budget: int = budget, capacity: int = capacity) -> ProbeResult:
            measured = curve[m]
            if footprint(measured) > capacity:  # the real backend stops at its capacity
                return ProbeResult(micro_batch_size=m, fits=False, oom=True)
            return measured.model_copy(update={"fits": footprint(measured) <= budget})

        kwargs: dict[str, object] = {}
        if name in PREDICTED and predictions is not None:
            factor, share = distortion or (1.0, 0.0)
            seen = distorted(predictions, factor, int(share * budget))
            predict: PredictFn = seen.get
            kwargs["predict"] = predict
        outcome = AIMED[name](probe, cap=sizes[-1], budget_bytes=budget, **kwargs)
        total += 1
        exact += outcome.max_micro_batch_size == truth(curve, budget)
        probes.append(len(outcome.probes))
    return exact, total, probes


@dataclass
class CaseResult:
    """One workload's figures: a row per real run, its runs per search, replay rows."""

    rows: list[list[str]]
    runs: dict[str, list[tuple[int, int, float, bool]]]
    replay_rows: list[list[str]]
    prediction_row: list[str] = dataclasses.field(default_factory=list)


def wide_replay(replay_rows: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """The replay as one row per workload and one column per strategy: ``median / max``
    probes, with the budgets missed when a strategy was not exact at every one."""
    strategies = list(dict.fromkeys(row[1] for row in replay_rows))
    workloads = list(dict.fromkeys(row[0] for row in replay_rows))
    cells = {(row[0], row[1]): row for row in replay_rows}
    rows = []
    for workload in workloads:
        line = [workload, cells[(workload, strategies[0])][2].partition("/")[2]]
        for strategy in strategies:
            _, _, exact, median, most, _ = cells[(workload, strategy)]
            found, _, total = exact.partition("/")
            missed = "" if found == total else f", {int(total) - int(found)} missed"
            line.append(f"{median} / {most}{missed}")
        rows.append(line)
    header = ["workload", "budgets", *(s.removeprefix("model, predictions ") for s in strategies)]
    return header, rows


def measure_case(
    case: Case, searches: dict[str, Search], curves: Path | None, *, real: bool = True
) -> CaseResult:
    started = time.perf_counter()
    curve = scan_curve(case, curves)
    print(
        f"{case.label}: scanned sizes 1..{case.scan_to} in {time.perf_counter() - started:.0f} s",
        flush=True,
    )
    predictions = scan_predictions(case, curves)
    equal = sum(same_peaks(predictions[m], curve[m]) for m in curve)
    dry_s, probe_s = time_predictions(case)
    print(f"{case.label}: predictions equal to the measurements at {equal}/{len(curve)} sizes")
    result = CaseResult([], {name: [] for name in searches}, [])
    result.prediction_row = [
        case.label,
        f"{equal}/{len(curve)}",
        f"{dry_s:.2f}",
        f"{probe_s:.2f}",
        f"{dry_s / probe_s:.2f}",
    ]
    replays: list[tuple[str, str, tuple[float, float] | None]] = [
        ("model", "model", None),
        *((f"model, predictions {label}", "model", (f, c)) for label, f, c in DISTORTIONS),
        ("model-no-dry-run", "model-no-dry-run", None),
        ("model-previous", "model-previous", None),
        ("bisect", "bisect", None),
    ]
    for label, name, distortion in replays:
        exact, total, probes = replay(curve, name, predictions, distortion)
        result.replay_rows.append(
            [
                case.label,
                label,
                f"{exact}/{total}",
                f"{statistics.median(probes):g}",
                str(max(probes)),
                f"{statistics.mean(probes):.2f}",
            ]
        )
    for target in case.targets if real else []:
        limit = limit_for(curve, target)
        true_size = truth(curve, int((1 - HEADROOM) * limit))
        for name, search in searches.items():
            outcome, wall = run_real(case, limit, name, search)
            steps = sum(p.steps_run for p in outcome.probes)
            found = outcome.max_micro_batch_size
            result.runs[name].append((len(outcome.probes), steps, wall, found == true_size))
            row = [
                case.label,
                str(true_size),
                name,
                str(found),
                verdict(found, true_size),
                str(len(outcome.probes)),
                str(steps),
                f"{wall:.2f}",
            ]
            result.rows.append(row)
            print("  " + "  ".join(row), flush=True)
    return result


def case_result(
    case: Case,
    searches: dict[str, Search],
    curves: Path | None,
    results: Path | None,
    *,
    real: bool = True,
) -> CaseResult:
    """``measure_case``, or its figures kept in ``results`` by an earlier run (workloads
    can then be measured by separate processes and the section written from them all).
    Without ``real``, a workload with no kept figures gets its replays only."""
    path = None if results is None else results / f"{case.label}.json"
    if path is not None and path.exists():
        kept = json.loads(path.read_text())
        runs = {name: [tuple(run) for run in r] for name, r in kept["runs"].items()}
        return CaseResult(kept["rows"], runs, kept["replay_rows"], kept["prediction_row"])
    if not real:
        return measure_case(case, searches, curves, real=False)
    result = measure_case(case, searches, curves)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dataclasses.asdict(result)))
    return result


def check_baselines() -> None:
    """Stop before measuring anything unless the baselines behave as their tools document
    and the previous rules are the ones compared with (``bench/test_baselines.py``)."""
    checks = Path(__file__).with_name("test_baselines.py")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(checks)]
    if subprocess.run(command, cwd=checks.parent.parent, check=False).returncode != 0:
        raise SystemExit(f"{checks.name} failed: the baselines would be compared wrongly")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small smoke run; writes nothing")
    parser.add_argument("--no-write", action="store_true", help="do not touch BENCHMARKS.md")
    parser.add_argument(
        "--curves",
        type=Path,
        default=None,
        help="directory to keep scanned curves in and reuse them from",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="directory to keep each workload's figures in and reuse them from",
    )
    parser.add_argument(
        "--replays-only-where-missing",
        action="store_true",
        help="workloads with no figures in --results get their replays only, no real runs",
    )
    parser.add_argument(
        "--only",
        default=None,
        help="comma-separated workloads to measure (with --results); writes nothing",
    )
    args = parser.parse_args(argv)
    check_baselines()
    cases = QUICK_CASES if args.quick else CASES
    if args.only is not None:
        cases = [case for case in cases if case.label in args.only.split(",")]
    searches = _searches()

    rows: list[list[str]] = []
    per_strategy: dict[str, list[tuple[int, int, float, bool]]] = {name: [] for name in searches}
    replay_rows: list[list[str]] = []
    prediction_rows: list[list[str]] = []
    per_workload: dict[tuple[str, str], list[int]] = {}
    for case in cases:
        result = case_result(
            case,
            searches,
            args.curves,
            args.results,
            real=not args.replays_only_where_missing,
        )
        rows += result.rows
        replay_rows += result.replay_rows
        prediction_rows.append(result.prediction_row)
        for name, runs in result.runs.items():
            per_strategy[name] += runs
            if runs:
                per_workload[(case.label, name)] = [run[0] for run in runs]
    measured = sorted({label for label, _ in per_workload})

    if not measured:  # replays only: there are no real runs to sum up
        print(
            markdown_table(
                ["workload", "sizes predicted to the byte", "dry-run s per size"], prediction_rows
            )
        )
        print(
            markdown_table(
                ["workload", "strategy", "exact", "median probes", "max probes", "mean probes"],
                replay_rows,
            )
        )
        return 0
    summary = []
    for name, runs in per_strategy.items():
        summary.append(
            [
                name,
                f"{sum(r[3] for r in runs)}/{len(runs)}",
                f"{statistics.median(r[0] for r in runs):g}",
                f"{statistics.median(r[1] for r in runs):g}",
                f"{sum(r[2] for r in runs):.1f}",
            ]
        )
    model_median = statistics.median(r[0] for r in per_strategy["model"])
    undry_median = statistics.median(r[0] for r in per_strategy["model-no-dry-run"])
    previous_median = statistics.median(r[0] for r in per_strategy["model-previous"])
    bisect_median = statistics.median(r[0] for r in per_strategy["bisect"])
    workload_rows = [
        [label, name, f"{statistics.median(counts):g}", str(max(counts))]
        for (label, name), counts in per_workload.items()
    ]
    body = "\n\n".join(
        [
            "## Search: probes to find the largest micro batch (`bench/search.py`)",
            f"Machine: {machine_line()}. CPU backend, headroom {HEADROOM:.0%}, "
            f"size cap {SIZE_CAP}. "
            "Every strategy uses the same probe (2 warm-up steps, 1 measured step, 1 timed "
            "step; 2 micro batches a step), so the differences are the search policy's.",
            f"### Summary over all limits (real runs on {', '.join(measured)})",
            markdown_table(
                ["strategy", "exact M*", "median probes", "median steps", "total wall s"], summary
            ),
            f"`model` used a median of {model_median:g} probes against {bisect_median:g} for "
            f"`bisect` ({model_median / bisect_median:.0%}), {undry_median:g} without the dry "
            f"run (`model-no-dry-run`) and {previous_median:g} under its previous rules "
            "(`model-previous`). The wall time of `model` includes its dry run. Wall times "
            "are of one run each and move with the machine's load (other work shared it "
            "during these runs); the dry run's cost is the side-by-side ratio below.",
            "### The dry run's predictions against the measured curve",
            markdown_table(
                [
                    "workload",
                    "sizes predicted to the byte",
                    "s per prediction",
                    "s per real probe",
                    "ratio",
                ],
                prediction_rows,
            ),
            "Seconds at sizes 1, the middle and the end of the scan, a fresh dry run's "
            "warm-up included, measured side by side in one process. A prediction runs one "
            "step on fake tensors, a real probe four (two warm-up, one measured, one timed); "
            "a fake step costs the operators' dispatch without their arithmetic, so on these "
            "small CPU models, whose arithmetic is cheap, a prediction costs from a tenth of a "
            "probe to as much as one; on a GPU workload it is the probes' compute it avoids.",
            "### Replayed on the measured curves, every budget between consecutive sizes "
            f"({', '.join(case.label for case in cases)})",
            markdown_table(*wide_replay(replay_rows)),
            "Each cell: median / max probes over the budgets; every search found the exact M* "
            "at every budget unless the cell says how many it missed. `3% low`, `3% high` and "
            "`5% of budget short`: `model` with its predictions made that wrong on purpose.",
            "How the baselines fall short, as re-implemented from their documentation: "
            "Lightning `power` keeps the last power of two that fit (up to half of M* lost); "
            "Lightning `binsearch` finds M* with about twice the probes of `model` and then "
            "takes 5% off; accelerate starts at 128 and shrinks by 0.9 per failure, so it "
            "never goes above 128 and lands up to 10% low; Composer halves from the batch "
            "size and keeps the first power-of-two fraction that fits.",
        ]
    )
    # Every workload, strategy and limit: printed, not kept in BENCHMARKS.md (which holds
    # each benchmark's current result in brief; the summary and the replay say it).
    details = "\n\n".join(
        [
            "### Probes per workload and strategy over its limits",
            markdown_table(["workload", "strategy", "median probes", "max probes"], workload_rows),
            "### Replayed, each strategy's row",
            markdown_table(
                ["workload", "strategy", "exact", "median probes", "max probes", "mean probes"],
                replay_rows,
            ),
            "### Each limit (truth from probing every size)",
            markdown_table(
                [
                    "workload",
                    "true M*",
                    "strategy",
                    "found",
                    "vs truth",
                    "probes",
                    "steps",
                    "wall s",
                ],
                rows,
            ),
        ]
    )
    print()
    print(body)
    print()
    print(details)
    if not (args.quick or args.no_write or args.only):
        write_section("search", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
