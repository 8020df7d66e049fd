"""How the dashboard writes numbers and times: binary units for memory, separators for
counts, UTC for dates. Jinja filters, and the same rules as ``static/dashboard.js``."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from jinja2 import Environment

from tuner.core.errors import BadInputError
from tuner.core.parallel import SIMULATED_RANKS_NOTE
from tuner.core.plan import format_runs
from tuner.core.shape import MeshShape

_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def fmt_bytes(value: float | None) -> str:
    """``1536 * 2**20`` reads ``1.50 GiB``: three significant digits, binary units."""
    if value is None:
        return "—"
    sign = "−" if value < 0 else ""
    size = abs(float(value))
    unit = 0
    while size >= 1024 and unit < len(_BINARY_UNITS) - 1:
        size /= 1024
        unit += 1
    if unit == 0:
        return f"{sign}{size:.0f} B"
    digits = 2 if size < 10 else 1 if size < 100 else 0
    return f"{sign}{size:.{digits}f} {_BINARY_UNITS[unit]}"


def fmt_int(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def fmt_rate(value: float | None) -> str:
    """Samples per second, with as many decimals as a reader can use."""
    if value is None:
        return "—"
    if value >= 100:
        return f"{value:,.0f}/s"
    if value >= 10:
        return f"{value:.1f}/s"
    return f"{value:.2f}/s"


def fmt_percent(fraction: float | None) -> str:
    if fraction is None:
        return "—"
    percent = fraction * 100
    return f"{percent:.0f}%" if abs(percent - round(percent)) < 0.05 else f"{percent:.1f}%"


def fmt_seconds(value: float | None) -> str:
    if value is None:
        return "—"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.1f} s"
    minutes, seconds = divmod(round(value), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def fmt_datetime(value: datetime | None) -> str:
    """``2026-11-01 09:30 UTC``: one zone for everyone reading the same fleet."""
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def fmt_iso(value: datetime | None) -> str:
    return "" if value is None else value.astimezone(UTC).isoformat(timespec="seconds")


def fmt_ago(value: datetime | None, now: datetime | None = None) -> str:
    """``5 s ago``, ``3 min ago``, ``2 h ago``, ``4 d ago``; the date beyond a month."""
    if value is None:
        return "never"
    seconds = ((now or datetime.now(UTC)) - value).total_seconds()
    if seconds < 0:
        return "just now" if seconds > -60 else fmt_datetime(value)
    if seconds < 60:
        return f"{seconds:.0f} s ago"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min ago"
    if seconds < 86400:
        return f"{seconds // 3600:.0f} h ago"
    if seconds < 30 * 86400:
        return f"{seconds // 86400:.0f} d ago"
    return fmt_datetime(value)


def oom_cap(oom_limit: int) -> str:
    """The one phrase for an OOM reported in training, with its one number: the largest
    micro batch recommendations still use (``tuner.core.plan.below_oom``'s bound)."""
    return f"out of memory reported in training: recommendations use at most {oom_limit - 1}"


def mesh_label(world_size: int, tp: int) -> str:
    """A mesh as its badge reads: ``2 × 2 mesh`` (dp × tp); ``""`` without one (or where
    the numbers make none, by the shape's own rules)."""
    try:
        mesh = MeshShape(world_size, tp)
    except BadInputError:
        return ""
    return f"{mesh} mesh" if mesh.is_mesh else ""


def mode_label(mode: str, world_size: int) -> str:
    """A run's parallel mode and world size as a badge reads: ``1 process``, ``DDP × 2``."""
    if mode == "none" and world_size == 1:
        return "1 process"
    return f"{'1 process' if mode == 'none' else mode.upper()} × {world_size}"


def variant_text(options: Mapping[str, object]) -> str:
    """Variant options as ``-o name=value`` takes them: ``checkpointing=true precision=bf16``."""
    return " ".join(f"{name}={_option_text(value)}" for name, value in options.items())


def _option_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def install_filters(environment: Environment) -> None:
    environment.filters.update(
        bytes=fmt_bytes,
        num=fmt_int,
        rate=fmt_rate,
        percent=fmt_percent,
        seconds=fmt_seconds,
        datetime=fmt_datetime,
        iso=fmt_iso,
        ago=fmt_ago,
        split=format_runs,  # the answer's split travels as runs [[size, count], ...]
        oom_cap=oom_cap,
        mode_label=mode_label,
        mesh_label=mesh_label,
        variant=variant_text,
    )
    # What a profile measured by one process standing for rank 0 says of itself.
    environment.globals["simulated_ranks_note"] = SIMULATED_RANKS_NOTE
