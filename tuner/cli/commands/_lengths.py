"""``tuner profile TARGET --seq-lens 256,512,1024``: one workload at several sequence
lengths in one search (:func:`tuner.engine.lengths.profile_lengths`), a profile per length
stored as one family, and the fit across lengths that answers the lengths between. The
steps around it (device, client, failures, upload, exit status) are ``tuner profile``'s
own (:func:`tuner.cli.commands.profile.run`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from tuner.core.errors import BadInputError
from tuner.core.lengths import EXTRAPOLATION, SHORTEST_FRACTION, LengthFit, fit_length_profiles
from tuner.core.reports import LengthsReport, ProfileReport
from tuner.core.shape import MeshShape
from tuner.core.units import format_bytes

if TYPE_CHECKING:
    from tuner.cli.display import LiveProgress
    from tuner.core.plan import Recommendation
    from tuner.core.results import Profile
    from tuner.engine.backends import Backend


def seq_lens(text: str) -> list[int]:
    """``256,512,1024`` as whole numbers (checked positive and distinct before probing)."""
    lengths = []
    for part in text.split(","):
        try:
            lengths.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{part.strip()!r} is not a whole number: give lengths like 256,512,1024"
            ) from None
    return lengths


def check_combinations(args: argparse.Namespace) -> None:
    """What --seq-lens does not combine with, refused before anything loads."""
    if args.explore:
        raise BadInputError(
            "--seq-lens profiles the workload as loaded at each length: leave out --explore "
            "(explore its variants at one length with -o seq_len=N)"
        )
    if args.parallel not in (None, "none") or args.parallel_option:
        raise BadInputError(
            "--seq-lens measures one process: leave out --parallel and --parallel-option "
            "(profile each length under DDP or FSDP with -o seq_len=N)"
        )


class Lengths:
    """The workload at each of ``--seq-lens``: a profile per length, the fit across them.
    One step of :func:`tuner.cli.commands.profile.run`'s pipeline each, as the plain
    profile's are."""

    subject = "the profiles were"

    def __init__(self, args: argparse.Namespace) -> None:
        from tuner.engine.lengths import check_seq_lens, target_builder
        from tuner.engine.workload import parse_options

        self.args = args
        self.lengths = check_seq_lens(args.seq_lens)
        self.build = target_builder(args.target, parse_options(args.option))

    def load(self, backend: Backend) -> None:
        self.backend = backend  # each length's workload is loaded as it is profiled
        # Each length is measured in one process; the plan is for the ranks named.
        self.mesh = MeshShape(self.args.world_size, self.args.tp or 1)

    def measure(self, stderr: Console) -> None:
        from tuner.cli.display import LiveProgress
        from tuner.core.results import ProbeSettings
        from tuner.engine.lengths import profile_lengths

        args = self.args

        def observe(seq_len: int) -> LiveProgress:
            stderr.print(f"seq_len {seq_len}: profiling ...", highlight=False)
            return LiveProgress(stderr)

        self.profiles = profile_lengths(
            self.build,
            self.lengths,
            self.backend,
            headroom=args.headroom,
            strategy=args.strategy,
            size_cap=args.size_cap,
            settings=ProbeSettings(warmup_steps=args.warmup_steps),
            observe=observe,
            world_size=args.world_size,
            report=lambda line: stderr.print(line, highlight=False, markup=False),
        )

    def settle(self) -> list[Profile]:
        from tuner.answer.local import answer_from

        args = self.args
        self.plans: list[Recommendation | None] = [
            answer_from(
                p,
                global_batch_size=args.global_batch_size,
                mesh=self.mesh,
            )
            if p.max_micro_batch_size and args.global_batch_size is not None
            else None
            for p in self.profiles
        ]
        self.fit, self.no_fit = _fit(self.profiles)
        return self.profiles

    def write(self, ids: list[int], *, json_output: bool) -> None:
        if json_output:
            document = _document(self.profiles, self.plans, self.fit, ids).document()
            sys.stdout.write(json.dumps(document) + "\n")
        else:
            print_lengths(
                Console(), self.profiles, self.plans, self.fit, self.no_fit, stored=bool(ids)
            )

    def stored(self, ids: list[int]) -> str:
        return f"profiles {', '.join(map(str, ids))}"

    def nothing_fits(self) -> str | None:
        from tuner.engine.profiler import nothing_fits_advice

        if any(p.max_micro_batch_size for p in self.profiles):
            return None
        shortest = self.profiles[0]
        return nothing_fits_advice(
            shortest, self.build(shortest.workload.seq_len or self.lengths[0])
        )


def _fit(profiles: list[Profile]) -> tuple[LengthFit | None, str]:
    """The fit across the lengths, or why there is none (too few lengths where any fits)."""
    measured = [p for p in profiles if p.max_micro_batch_size]
    if len(measured) < 2:
        return None, "it needs two or more lengths at which a micro batch fits"
    try:
        return fit_length_profiles(measured, [p.workload.seq_len or 0 for p in measured]), ""
    except BadInputError as exc:
        return None, exc.message


def print_lengths(
    console: Console,
    profiles: list[Profile],
    plans: list[Recommendation | None],
    fit: LengthFit | None,
    no_fit: str,
    *,
    stored: bool,
) -> None:
    """The table per length, the fit, the family and how to ask for another length."""
    console.print(lengths_table(profiles, plans))
    if fit is not None:
        console.print(
            "fit       peak(m, s) ≈ a0 + a1·s + b·m·s + c·m·s² with "
            f"a0 = {format_bytes(int(fit.fixed_bytes))}, a1 = {fit.fixed_per_token_bytes:,.1f} B, "
            f"b = {fit.per_token_bytes:,.1f} B, c = {fit.per_token_pair_bytes:,.3f} B; "
            f"within {fit.max_relative_error:.2%} of every peak near the boundary",
            highlight=False,
            soft_wrap=True,
        )
    else:
        console.print(
            f"fit       none: {no_fit}; other lengths are not estimated",
            highlight=False,
            soft_wrap=True,
        )
    first, last = profiles[0], profiles[-1]
    console.print(
        f"family    {first.workload.length_family} (workload keys: "
        f"{', '.join(p.workload_key for p in profiles)})\n"
        f"device    {first.device.kind} {first.device.name} ({first.device_key})",
        highlight=False,
        soft_wrap=True,
    )
    if fit is not None:  # the range the service estimates over: the lengths of the fit
        shortest, longest = fit.seq_lens[0], fit.seq_lens[-1]
        reach = (
            f"estimated from {int(shortest * SHORTEST_FRACTION)} to "
            f"{int(longest * EXTRAPOLATION)}, measured at the lengths above"
        )
    else:
        reach = "N one of the lengths above"
    console.print(
        f"other lengths: tuner recommend --workload {last.workload_key} --device "
        f"{first.device_key} --global-batch-size B --seq-len N ({reach}"
        f"{'' if stored else '; profile with --upload to store them'})",
        highlight=False,
        soft_wrap=True,
    )


def lengths_table(profiles: list[Profile], plans: list[Recommendation | None]) -> Table:
    """One row per length: M*, tokens per micro batch, probes, peak at M*, the plan."""
    table = Table(
        title="Sequence lengths (measured)",
        title_justify="left",
        header_style="bold",
        caption="M* 0: nothing fits; tokens: M* × seq_len; probes: this length's search "
        "(later lengths start from the earlier ones' fit); peak: at M*",
        caption_justify="left",
    )
    with_plans = any(plan is not None for plan in plans)
    columns = ["seq_len", "M*", "tokens", "probes", "peak", *(["plan"] if with_plans else [])]
    for column in columns:
        table.add_column(column, justify="left" if column == "plan" else "right")
    for profile, plan in zip(profiles, plans, strict=True):
        at_max = profile.probe_at(profile.max_micro_batch_size)
        found = profile.max_micro_batch_size
        row = [
            str(profile.workload.seq_len),
            str(found),
            f"{found * (profile.workload.seq_len or 0):,}",
            str(len(profile.probes)),
            format_bytes(at_max.footprint_bytes) if at_max and at_max.footprint_bytes else "-",
        ]
        if with_plans:
            row.append(plan.describe() if plan is not None else "-")
        table.add_row(*row)
    return table


def _document(
    profiles: list[Profile],
    plans: list[Recommendation | None],
    fit: LengthFit | None,
    uploaded: list[int],
) -> LengthsReport:
    """``--json``: the family, the fit and every length's profile (with its plan and id)."""
    return LengthsReport(
        length_family=profiles[0].workload.length_family,
        seq_lens=[p.workload.seq_len or 0 for p in profiles],
        fit=fit,
        profiles=[
            ProfileReport.of(
                profile,
                recommendation=plan,
                profile_id=uploaded[index] if uploaded else None,
                seq_len=profile.workload.seq_len,
                tokens_per_micro_batch=profile.max_micro_batch_size
                * (profile.workload.seq_len or 0),
            )
            for index, (profile, plan) in enumerate(zip(profiles, plans, strict=True))
        ],
    )
