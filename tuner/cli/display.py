"""What a person sees while probes run and after: a live table, then the result."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table

from tuner.core.parallel import SIMULATED_RANKS_NOTE, mesh_text
from tuner.core.plan import Recommendation
from tuner.core.results import MemoryBreakdown, ProbeResult, Profile
from tuner.core.shape import ONE_PROCESS, MeshShape
from tuner.core.speeds import SpeedCurve
from tuner.core.units import format_bytes

if TYPE_CHECKING:
    from tuner.engine.explore import Exploration

# Characters in the longest bar of the per-block table.
BAR_WIDTH = 30


def probe_table(probes: list[ProbeResult], *, title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    for column in ("micro batch", "fits", "peak allocated", "peak reserved", "samples/s", "time"):
        table.add_column(column, justify="right")
    for probe in probes:
        verdict = "[green]yes[/]" if probe.fits else ("[red]OOM[/]" if probe.oom else "[red]no[/]")
        table.add_row(
            str(probe.micro_batch_size),
            verdict,
            format_bytes(probe.peak_allocated_bytes),
            format_bytes(probe.peak_reserved_bytes),
            f"{probe.samples_per_second:,.1f}" if probe.samples_per_second else "-",
            f"{probe.wall_time_s:.2f} s",
        )
    return table


def probe_line(probe: ProbeResult) -> str:
    verdict = "fits" if probe.fits else ("out of memory" if probe.oom else "over budget")
    peak = f", peak {format_bytes(probe.peak_bytes)}" if probe.peak_bytes is not None else ""
    return f"probe {probe.micro_batch_size}: {verdict}{peak}, {probe.wall_time_s:.2f} s"


class LiveProgress:
    """Shows each probe as it runs: a growing table on a terminal, one line each otherwise."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.probes: list[ProbeResult] = []
        self.current: int | None = None
        self._live: Live | None = None

    def __enter__(self) -> LiveProgress:
        if self.console.is_terminal:
            self._live = Live(
                self._render(), console=self.console, refresh_per_second=8, transient=True
            )
            self._live.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._live is not None:
            self._live.__exit__(exc_type, exc, tb)

    def probe_started(self, micro_batch_size: int) -> None:
        self.current = micro_batch_size
        if self._live is not None:
            self._live.update(self._render())

    def probe_finished(self, result: ProbeResult) -> None:
        self.probes.append(result)
        self.current = None
        if self._live is not None:
            self._live.update(self._render())
        else:
            self.console.print(probe_line(result), highlight=False)

    def _render(self) -> Group:
        parts: list[Table | Spinner] = [probe_table(self.probes, title="Probes")]
        if self.current is not None:
            parts.append(Spinner("dots", text=f"probing micro batch {self.current} ..."))
        return Group(*parts)


def ranks_line(profile: Profile, mesh: MeshShape = ONE_PROCESS) -> str:
    """Where the probes ran: W ranks under DDP/FSDP, or one process (and what that means
    when the plan is for more than one rank)."""
    if profile.parallel.distributed:
        measured = mesh_text(profile.parallel, profile.world_size)
        shape = f" as a {measured}" if measured else ""
        where = f"measured on {profile.world_size} ranks{shape}, {profile.parallel.describe()}"
        if profile.settings.simulated_ranks:
            where += f"; {SIMULATED_RANKS_NOTE}"
        return where
    if mesh.world_size > 1:
        return (
            f"measured in one process; for {mesh.world_size} ranks the plan only divides the "
            "batch (DDP's gradient buckets or FSDP's shards are not in it: use --parallel "
            "ddp|fsdp to measure them)"
        )
    return "measured in one process"


def rank_table(probe: ProbeResult, mesh: MeshShape = ONE_PROCESS) -> Table:
    """Each rank's peak and where it went, for the probe at ``M*``; on a mesh, each rank's
    place in it (data-parallel group, tensor-parallel rank)."""
    table = Table(title=f"Per rank at micro batch {probe.micro_batch_size}", title_justify="left")
    columns = ("rank", "peak", "parameters", "gradients", "optimizer", "communication", "other")
    for column in columns:
        table.add_column(column, justify="right")
    for rank, (peak, parts) in enumerate(
        zip(probe.rank_peaks_bytes, probe.rank_breakdowns, strict=False)
    ):
        group, tp_rank = mesh.coordinates(rank)
        table.add_row(
            f"{rank} (dp {group}, tp {tp_rank})" if mesh.is_mesh else str(rank),
            format_bytes(peak),
            format_bytes(parts.parameters_bytes),
            format_bytes(parts.gradients_bytes),
            format_bytes(parts.optimizer_state_bytes),
            format_bytes(parts.communication_bytes),
            format_bytes(parts.activations_bytes),
        )
    return table


def mesh_savings(profile: Profile, parts: MemoryBreakdown) -> str:
    """What the mesh saved a rank: its parameters against the whole model's (fp32: 4 B a
    parameter), and the split that accounts for it: ``dp·tp`` for the layers the plan
    splits, ``dp`` for the rest."""
    mesh = profile.mesh
    whole = profile.workload.parameter_count * 4
    held = parts.parameters_bytes
    share = f" (1/{whole / held:.1f})" if held else ""
    return (
        f"mesh      {mesh.dp} × {mesh.tp}: parameters {format_bytes(held)} a rank of "
        f"{format_bytes(whole)} whole{share}; gradients and optimizer state shard alike: "
        f"÷{mesh.world_size} for the layers the tp plan splits, ÷{mesh.dp} for the rest; "
        f"the split layers' activations ÷{mesh.tp}"
    )


def block_table(probe: ProbeResult) -> Table | None:
    """Activations saved for backward per top-level block, with a bar each, and the phase
    in which the step's peak fell."""
    breakdown = probe.breakdown
    if breakdown is None or not breakdown.activations_by_block_bytes:
        return None
    by_block = breakdown.activations_by_block_bytes
    largest = max(by_block.values()) or 1
    total = sum(by_block.values()) or 1
    phase = f", peak in {breakdown.peak_phase}" if breakdown.peak_phase else ""
    table = Table(
        title=f"Saved for backward at micro batch {probe.micro_batch_size}{phase}",
        title_justify="left",
        header_style="bold",
    )
    for column, justify in (("block", "left"), ("bytes", "right"), ("share", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    table.add_column("", justify="left")
    for name, size in by_block.items():
        table.add_row(
            name,
            format_bytes(size),
            f"{size / total:.0%}",
            "█" * round(BAR_WIDTH * size / largest),
        )
    return table


def peak_line(probe: ProbeResult) -> str | None:
    """Where the peak is, in one line: its phase and the block that saves the most."""
    breakdown = probe.breakdown
    if breakdown is None or breakdown.peak_phase is None:
        return None
    line = f"peak      in {breakdown.peak_phase} at micro batch {probe.micro_batch_size}"
    if breakdown.activations_by_block_bytes:
        name, size = max(breakdown.activations_by_block_bytes.items(), key=lambda item: item[1])
        line += f"; most saved for backward by {name} ({format_bytes(size)})"
    return line


def variants_table(exploration: Exploration) -> Table:
    """One row per variant: M*, optimizer steps' micro batches, measured speed, peak."""
    table = Table(
        title="Variants (measured)",
        title_justify="left",
        header_style="bold",
        caption="M* 0: nothing fits; steps: micro batches per optimizer step; samples/s: a "
        "timed optimizer step of that plan (at M* without a global batch), per rank, the "
        "fastest of its rounds ± how far its rounds lie apart; peak: at M*",
        caption_justify="left",
    )
    columns = ("variant", "M*", "steps", "samples/s", "peak", "")
    for column in columns:
        # Numbers stay whole; a long variant label wraps between its options instead.
        left = column == "variant"
        table.add_column(column, justify="left" if left else "right", no_wrap=not left)
    for outcome in exploration.variants:
        profile, plan = outcome.profile, outcome.recommendation
        at_max = profile.probe_at(profile.max_micro_batch_size)
        speed = outcome.samples_per_second
        if speed is None and at_max is not None:
            speed = at_max.samples_per_second
        spread = f" ±{outcome.spread:.0%}" if speed and outcome.spread is not None else ""
        table.add_row(
            outcome.label or "as loaded",
            str(profile.max_micro_batch_size),
            str(plan.grad_accum) if plan is not None else "-",
            f"{speed:,.1f}{spread}" if speed else "-",
            format_bytes(at_max.peak_bytes) if at_max is not None else "-",
            "[bold green]chosen[/]" if outcome is exploration.chosen else "",
        )
    return table


def print_exploration(console: Console, exploration: Exploration) -> None:
    console.print(variants_table(exploration))
    chosen = exploration.chosen
    if chosen is None:
        console.print("[bold]no variant fits[/]", highlight=False)
        return
    plan = chosen.recommendation
    how = (
        f": {plan.describe()}"
        if plan is not None
        else f", micro batch up to {chosen.profile.max_micro_batch_size}"
    )
    basis = "a timed step of its plan" if plan is not None else "its probe at M*"
    console.print(
        f"[bold]variant: {chosen.label or 'as loaded'}[/] (measured by {basis}){how}",
        highlight=False,
    )
    if exploration.reason:
        console.print(f"why: {exploration.reason}", highlight=False)


def speeds_line(speeds: SpeedCurve) -> str:
    """The timed sizes, fastest round and spread each, and the optimizer step:
    ``micro batch 8: 151.2 samples/s ±3% · 16: … · optimizer step 0.012 s``."""
    parts = [
        f"{t.micro_batch_size}: {t.samples_per_second:.1f} samples/s ±{t.spread:.0%}"
        for t in speeds.sizes
    ]
    return (
        f"micro batch {' · '.join(parts)} (fastest of {len(speeds.sizes[0].seconds_per_sample)} "
        f"rounds ± their spread); optimizer step {speeds.optimizer_seconds:.3f} s"
    )


def speed_with_spread(recommendation: Recommendation) -> str:
    """``148.2 samples/s a rank (±4%, timed)`` or ``… (one probe)``."""
    speed = recommendation.expected_samples_per_second
    spread = recommendation.expected_speed_spread
    how = f"±{spread:.0%} over the timed rounds" if spread is not None else "one probe's step"
    return f"{speed:.1f} samples/s a rank ({how})"


def print_profile(
    console: Console,
    profile: Profile,
    recommendation: Recommendation | None,
    *,
    mesh: MeshShape = ONE_PROCESS,
    advice: list[str] | None = None,
) -> None:
    device = profile.device
    console.print(probe_table(profile.probes, title=f"Probes ({profile.strategy} search)"))
    at_max = profile.probe_at(profile.max_micro_batch_size)
    if at_max is not None and at_max.rank_breakdowns:
        console.print(rank_table(at_max, profile.mesh))
    if at_max is not None and at_max.breakdown is not None and profile.parallel.has_mesh:
        console.print(mesh_savings(profile, at_max.breakdown), highlight=False)
    located = at_max or profile.oversize_probe
    blocks = block_table(located) if located is not None else None
    if blocks is not None:
        console.print(blocks)
    console.print(
        f"workload  {profile.workload.name} ({profile.workload_key})\n"
        f"device    {device.kind} {device.name} ({profile.device_key})\n"
        f"ranks     {ranks_line(profile, mesh)}\n"
        f"memory    capacity {format_bytes(device.capacity_bytes)}, "
        f"budget {format_bytes(profile.budget_bytes)} ({profile.headroom:.0%} headroom)",
        highlight=False,
    )
    copies = at_max.collective_copies_bytes if at_max is not None else 0
    if copies and profile.settings.simulated_ranks:
        console.print(
            f"in flight +{format_bytes(copies)} at micro batch {profile.max_micro_batch_size}: "
            "the largest collective's buffer, counted as held at the peak (a real collective "
            "keeps its tensors until it completes); in the limit's check",
            highlight=False,
        )
    elif copies:
        console.print(
            f"gloo      +{format_bytes(copies)} at micro batch {profile.max_micro_batch_size}: "
            "gloo's all-gather copies on its worker threads, in the CPU limit's check; the peak "
            "shown stands for a GPU (NCCL makes no such copies)",
            highlight=False,
        )
    if profile.fit is not None:
        console.print(
            f"fit       peak ≈ {format_bytes(profile.fit.fixed_bytes)} + "
            f"{format_bytes(profile.fit.bytes_per_sample)} × micro batch (estimated)",
            highlight=False,
        )
    found = profile.max_micro_batch_size
    steps = sum(p.steps_run for p in profile.probes)
    capped = " (the --max cap)" if found == profile.size_cap else ""
    console.print(
        f"[bold]largest micro batch that fits: {found}{capped}[/]\n"
        f"          {len(profile.probes)} probes, {steps} training steps, "
        f"{profile.wall_time_s:.1f} s",
        highlight=False,
    )
    if profile.speeds is not None:
        console.print(f"speeds    {speeds_line(profile.speeds)}", highlight=False, markup=False)
    if recommendation is not None:
        console.print(
            f"[bold]for global batch {recommendation.global_batch_size}:[/] "
            + recommendation.describe(),
            highlight=False,
        )
        console.print(f"why       {recommendation.reason}", highlight=False, markup=False)
        if recommendation.expected_samples_per_second is not None:
            console.print(
                f"expected  {speed_with_spread(recommendation)}", highlight=False, markup=False
            )
    where = peak_line(located) if located is not None else None
    if where is not None:
        console.print(where, highlight=False)
    for line in advice or []:
        console.print(f"advice    {line}", highlight=False)
