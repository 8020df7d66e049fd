"""How well profiles at three sequence lengths predict a length never measured.

Each case profiles a workload at three lengths (the model search, CPU backend with a
memory limit), fits ``peak(m, s) ≈ a₀ + a₁·s + b·m·s + c·m·s²`` through their probes
(:mod:`tuner.core.lengths`), estimates ``M*`` and its peak at held-out lengths (one
between the measured ones, one beyond the longest), then profiles those lengths too and
compares. Target: ``M*`` never above the truth, and equal to it on at least 80% of cases;
the estimate's margin is the fit's error on each measured point left out of it.

Then it profiles all of a case's lengths as ``tuner profile --seq-lens`` does
(:func:`tuner.engine.lengths.profile_lengths`: shortest first, each later length aimed by
the earlier ones) and counts the probes per length against a model search of each length
alone, checking that both find the same ``M*``.

Run: ``python bench/seqlen.py`` (a few minutes), or ``--quick`` for a smoke run that
writes nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine_line, markdown_table, write_section
from tests.length_curves import Curves, replay_budgets, replay_family, scan_lengths, true_max
from tuner.core.errors import BadInputError
from tuner.core.lengths import estimate_length, fit_length_profiles
from tuner.core.results import Profile
from tuner.core.units import format_bytes
from tuner.engine.backends import CpuBackend, make_backend
from tuner.engine.lengths import profile_lengths
from tuner.engine.profiler import profile_workload
from tuner.engine.workload import Workload, load_workload

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"


@dataclass(frozen=True)
class Case:
    label: str
    target: str
    options: dict[str, object]
    memory_limit: int
    measured: tuple[int, ...]
    held_out: tuple[int, ...]


MiB = 2**20
CASES = [
    Case(
        "gpt (SDPA attention)",
        "examples.gpt:workload",
        {"vocab": 512, "dim": 64, "layers": 2, "heads": 4, "seq_len": 512},
        96 * MiB,
        (64, 128, 256),
        (192, 320),
    ),
    Case(
        "llama (transformers, eager attention)",
        "tuner.hf:causal_lm",
        {"config": str(ROOT / "tests" / "data" / "tiny_llama.json")},
        64 * MiB,
        (32, 64, 128),
        (96, 160),
    ),
]
QUICK_CASES = [
    Case(
        "gpt",
        "examples.gpt:workload",
        {"vocab": 128, "dim": 32, "layers": 1, "heads": 2, "seq_len": 128},
        16 * MiB,
        (16, 32, 64),
        (48,),
    )
]


# Replayed on every budget between consecutive footprints (scanned sizes per length).
REPLAYS: list[tuple[str, str, dict[str, object]]] = [
    ("gpt", "examples.gpt:workload", {"vocab": 64, "dim": 16, "layers": 1, "heads": 2}),
    ("gpt2 (transformers)", "tuner.hf:causal_lm", {"config": str(DATA / "tiny_gpt2.json")}),
    ("llama (transformers)", "tuner.hf:causal_lm", {"config": str(DATA / "tiny_llama.json")}),
]
REPLAY_SIZES = {16: 24, 32: 12, 64: 6}


def replay_rows(label: str, curves: Curves, headroom: float, template: Profile) -> list[str]:
    """Over every budget: exact at every length, the fit made, probes taken for it, the
    later lengths' probes (``template``: a profile of the workload to copy the rest from)."""
    budgets = replay_budgets(curves)
    exact = fitted = extra = fallback = 0
    later: list[int] = []
    for budget in budgets:
        profiles, notes = replay_family(curves, budget, template, headroom=headroom)
        exact += all(
            p.max_micro_batch_size == true_max(curves[p.workload.seq_len or 0], budget)
            for p in profiles
        )
        found = [p for p in profiles if p.max_micro_batch_size >= 1]
        try:
            fit_length_profiles(found, [p.workload.seq_len or 0 for p in found])
            fitted += 1
        except BadInputError:
            pass
        extra += sum("one more probe" in note for note in notes)
        fallback += any("no fit across lengths" in note for note in notes)
        later.extend(len(p.probes) for p in profiles[1:])
    answered, equal, above, refused, worst = left_out(curves, budgets, headroom, template)
    return [
        label,
        f"{headroom:.0%}",
        str(len(budgets)),
        f"{exact}/{len(budgets)}",
        f"{fitted}/{len(budgets)}",
        str(extra),
        str(fallback),
        f"{statistics.median(later):g}",
        str(max(later)),
        f"{equal}/{answered}",
        str(above),
        str(refused),
        f"{worst:.0%}",
    ]


def left_out(
    curves: Curves, budgets: list[int], headroom: float, template: Profile
) -> tuple[int, int, int, int, float]:
    """Each of the two shorter lengths left out of the family in turn (16 from 32 and 64,
    32 from 16 and 64) and estimated at every budget: answered, equal to the true M*,
    above it, refused, and the worst shortfall (1 − estimate / truth)."""
    answered = equal = above = refused = 0
    worst = 0.0
    shortest = sorted(curves)[:2]
    # The template's own search was capped at 1: an estimate is never above a profile's cap.
    template = template.model_copy(update={"size_cap": 4096})
    for held_out in shortest:
        family = {s: curve for s, curve in curves.items() if s != held_out}
        for budget in budgets:
            truth = true_max(curves[held_out], budget)
            profiles, _ = replay_family(family, budget, template, headroom=headroom)
            lengths = [p.workload.seq_len or 0 for p in profiles]
            try:
                found = estimate_length(profiles, lengths, held_out).max_micro_batch_size
            except BadInputError:
                refused += 1
                continue
            answered += 1
            equal += found == truth
            above += found > truth
            if truth:
                worst = max(worst, 1 - found / truth)
    return answered, equal, above, refused, worst


def build(case: Case, seq_len: int) -> Workload:
    return load_workload(case.target, {**case.options, "seq_len": seq_len})


def profile_at(case: Case, seq_len: int) -> Profile:
    backend = make_backend("cpu", memory_limit_bytes=case.memory_limit)
    return profile_workload(build(case, seq_len), backend)


def run_case(case: Case) -> tuple[list[list[str]], list[list[str]]]:
    """The held-out rows, and the probes-per-length rows."""
    profiles = {s: profile_at(case, s) for s in (*case.measured, *case.held_out)}
    return held_out_rows(case, profiles), probes_rows(case, profiles)


def probes_rows(case: Case, alone: dict[int, Profile]) -> list[list[str]]:
    """Every length of ``case`` profiled as ``--seq-lens`` does, against each length alone."""
    family = profile_lengths(
        lambda seq_len: build(case, seq_len),
        list(alone),
        make_backend("cpu", memory_limit_bytes=case.memory_limit),
    )
    rows = []
    for order, profile in enumerate(family, start=1):
        seq_len = profile.workload.seq_len
        assert seq_len is not None
        single = alone[seq_len]
        rows.append(
            [
                case.label,
                str(seq_len),
                str(order),
                str(profile.max_micro_batch_size),
                "yes" if profile.max_micro_batch_size == single.max_micro_batch_size else "NO",
                str(len(profile.probes)),
                str(len(single.probes)),
                " ".join(str(p.micro_batch_size) for p in profile.probes),
            ]
        )
    return rows


def held_out_rows(case: Case, profiles: dict[int, Profile]) -> list[list[str]]:
    rows = []
    for s in case.measured:
        found = profiles[s]
        rows.append(
            [
                case.label,
                str(s),
                "measured",
                str(found.max_micro_batch_size),
                "",
                "",
                "",
                str(len(found.probes)),
            ]
        )
    fitted = [profiles[s] for s in case.measured]
    for s in case.held_out:
        truth = profiles[s]
        try:
            estimate = estimate_length(fitted, list(case.measured), s)
        except BadInputError as exc:
            rows.append(
                [case.label, str(s), "held out", str(truth.max_micro_batch_size),
                 "refused", "", exc.message.split(":")[0], str(len(truth.probes))]
            )  # fmt: skip
            continue
        at = truth.probe_at(estimate.max_micro_batch_size)
        actual = at.footprint_bytes if at is not None else None
        error = (
            f"{estimate.expected_peak_bytes / actual - 1:+.2%}" if actual else "(size not probed)"
        )
        rows.append(
            [
                case.label,
                str(s),
                "held out",
                str(truth.max_micro_batch_size),
                str(estimate.max_micro_batch_size),
                format_bytes(estimate.expected_peak_bytes),
                error,
                str(len(truth.probes)),
            ]
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="held-out sequence length predictions")
    parser.add_argument("--quick", action="store_true", help="small smoke run; writes nothing")
    args = parser.parse_args(argv)
    rows: list[list[str]] = []
    probes: list[list[str]] = []
    for case in QUICK_CASES if args.quick else CASES:
        held_out, per_length = run_case(case)
        for row in [*held_out, *per_length]:
            print("  ".join(row), flush=True)
        rows.extend(held_out)
        probes.extend(per_length)
    replays = []
    for label, target, options in REPLAYS[:1] if args.quick else REPLAYS:
        curves = scan_lengths(target, options, REPLAY_SIZES)
        workload = load_workload(target, {**options, "seq_len": min(REPLAY_SIZES)})
        template = profile_workload(workload, CpuBackend(2**40), size_cap=1)
        for headroom in (0.0, 0.05):
            replays.append(replay_rows(label, curves, headroom, template))
            print("  ".join(replays[-1]), flush=True)
    body = "\n\n".join(
        [
            "## Sequence length: held-out predictions (`bench/seqlen.py`)",
            f"Machine: {machine_line()}. CPU backend with a memory limit, model search, "
            "5% headroom. Each workload is profiled at three lengths; the fit "
            "`a₀ + a₁·s + b·m·s + c·m·s²` through their probes near the boundary estimates "
            "the held-out lengths, which are then profiled too.",
            markdown_table(
                [
                    "workload",
                    "seq_len",
                    "",
                    "M* measured",
                    "M* estimated",
                    "estimated peak",
                    "peak error",
                    "probes",
                ],
                rows,
            ),
            "Peak error: the estimate's peak at its M* against the peak measured at that "
            "size (the search probed it, or the error says so). Target: M* never above the "
            "measured one, and equal to it on at least 80% of cases (here and in the "
            "replays' left-out lengths below).",
            "### Probes per length under `--seq-lens`",
            "Every length of each workload (the measured and the held-out ones) profiled "
            "in one `--seq-lens` search: shortest first, the first length a plain model "
            "search, each later one started from the M* the earlier ones predict (one "
            "length: bytes per sample above the resident parts scaled by length; two or "
            "more: the fit above) and confirmed by probes. Against the model search of "
            "each length alone.",
            markdown_table(
                [
                    "workload",
                    "seq_len",
                    "order profiled",
                    "M*",
                    "same M* alone",
                    "probes",
                    "probes alone",
                    "sizes probed",
                ],
                probes,
            ),
            summary(probes),
            "### Every budget, replayed",
            "The searches of `--seq-lens` (lengths 16, 32, 64) replayed on curves measured "
            "once with the limit lifted, at every budget between two consecutive footprints "
            "(as `bench/search.py` replays the model search). With no headroom a probe past "
            "the budget runs out of memory and leaves no peak; a right guess then leaves "
            "its length a single peak, and that length takes one more probe (the smallest "
            "size within a factor of two below its M*) so that the fit can be made and can "
            "learn its error by leaving each point out (the first length too, where its "
            "search left a single peak). Where "
            "no length after the first has a size to spare (M* 1), later lengths are "
            "aimed from one length and no fit is made (`no fit`); the other budgets "
            "without a fit are those where fewer than two lengths fit a micro batch.",
            markdown_table(
                [
                    "workload",
                    "headroom",
                    "budgets",
                    "exact at every length",
                    "fit made",
                    "probes for the fit",
                    "no fit",
                    "probes per later length (median)",
                    "max",
                    "left out: M* exact",
                    "above",
                    "refused",
                    "worst shortfall",
                ],
                replays,
            ),
            "Left out: lengths 16 and 32 each left out of the family in turn and estimated "
            "from the other two at every budget (`tuner.core.lengths.estimate_length`, its "
            "margin the fit's error on each measured point left out of it). Exact: the "
            "estimate equals the true M*; above: above it (the one answer never to give); "
            "refused: no fit, or a fit that cannot know its error; worst shortfall: the "
            "largest 1 − estimate / true M*.",
        ]
    )
    print()
    print(body)
    if not args.quick:
        write_section("seqlen", body)
    return 0


def summary(rows: list[list[str]]) -> str:
    """First lengths against later ones, in probes."""
    first = [int(row[5]) for row in rows if row[2] == "1"]
    later = sorted(int(row[5]) for row in rows if row[2] != "1")
    alone = sorted(int(row[6]) for row in rows if row[2] != "1")
    exact = all(row[4] == "yes" for row in rows)
    return (
        f"First lengths: {', '.join(map(str, first))} probes. Later lengths: median "
        f"{later[len(later) // 2]}, at most {later[-1]} (alone: median "
        f"{alone[len(alone) // 2]}, at most {alone[-1]}). M* the same as each length's "
        f"own search at every length: {'yes' if exact else 'NO'}."
    )


if __name__ == "__main__":
    sys.exit(main())
