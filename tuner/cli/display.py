"""What a person sees while probes run and after: a live table, then the result."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console, Group
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table

from tuner.core.plan import Recommendation
from tuner.core.results import ProbeResult, Profile
from tuner.core.units import format_bytes


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


def ranks_line(profile: Profile, world_size: int = 1) -> str:
    """Where the probes ran: W ranks under DDP/FSDP, or one process (and what that means
    when the plan is for more than one rank)."""
    if profile.parallel.distributed:
        return f"measured on {profile.world_size} ranks, {profile.parallel.describe()}"
    if world_size > 1:
        return (
            f"measured in one process; for {world_size} ranks the plan only divides the "
            "batch (DDP's gradient buckets or FSDP's shards are not in it: use --parallel "
            "ddp|fsdp to measure them)"
        )
    return "measured in one process"


def rank_table(probe: ProbeResult) -> Table:
    """Each rank's peak and where it went, for the probe at ``M*``."""
    table = Table(title=f"Per rank at micro batch {probe.micro_batch_size}", title_justify="left")
    columns = ("rank", "peak", "parameters", "gradients", "optimizer", "communication", "other")
    for column in columns:
        table.add_column(column, justify="right")
    for rank, (peak, parts) in enumerate(
        zip(probe.rank_peaks_bytes, probe.rank_breakdowns, strict=False)
    ):
        table.add_row(
            str(rank),
            format_bytes(peak),
            format_bytes(parts.parameters_bytes),
            format_bytes(parts.gradients_bytes),
            format_bytes(parts.optimizer_state_bytes),
            format_bytes(parts.communication_bytes),
            format_bytes(parts.activations_bytes),
        )
    return table


def print_profile(
    console: Console,
    profile: Profile,
    recommendation: Recommendation | None,
    *,
    world_size: int = 1,
    advice: list[str] | None = None,
) -> None:
    device = profile.device
    console.print(probe_table(profile.probes, title=f"Probes ({profile.strategy} search)"))
    at_max = profile.probe_at(profile.max_micro_batch_size)
    if at_max is not None and at_max.rank_breakdowns:
        console.print(rank_table(at_max))
    console.print(
        f"workload  {profile.workload.name} ({profile.workload_key})\n"
        f"device    {device.kind} {device.name} ({profile.device_key})\n"
        f"ranks     {ranks_line(profile, world_size)}\n"
        f"memory    capacity {format_bytes(device.capacity_bytes)}, "
        f"budget {format_bytes(profile.budget_bytes)} ({profile.headroom:.0%} headroom)",
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
    if recommendation is not None:
        console.print(
            f"[bold]for global batch {recommendation.global_batch_size}:[/] "
            + recommendation.describe(),
            highlight=False,
        )
        console.print(f"why       {recommendation.reason}", highlight=False, markup=False)
    for line in advice or []:
        console.print(f"advice    {line}", highlight=False)
