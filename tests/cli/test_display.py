"""tuner.cli.display: the probe table, the live progress and the final report."""

from __future__ import annotations

import io

from rich.console import Console

from tuner.cli.display import LiveProgress, print_profile, probe_line, probe_table, rank_table
from tuner.core.plan import recommend
from tuner.core.results import (
    AffineFit,
    DeviceInfo,
    MemoryBreakdown,
    ProbeResult,
    ProbeSettings,
    Profile,
    WorkloadInfo,
)
from tuner.core.shape import MeshShape

FITS = ProbeResult(
    micro_batch_size=8,
    fits=True,
    peak_allocated_bytes=3 * 2**20,
    peak_reserved_bytes=4 * 2**20,
    samples_per_second=1234.5,
    wall_time_s=0.5,
)
OVER = ProbeResult(
    micro_batch_size=16, fits=False, peak_allocated_bytes=9 * 2**20, peak_reserved_bytes=9 * 2**20
)
OOM = ProbeResult(micro_batch_size=32, fits=False, oom=True, wall_time_s=0.25)


def console_to(buffer: io.StringIO, *, terminal: bool = False, width: int = 120) -> Console:
    return Console(file=buffer, width=width, force_terminal=terminal, color_system=None)


def render(renderable: object) -> str:
    buffer = io.StringIO()
    console_to(buffer).print(renderable)
    return buffer.getvalue()


def test_probe_line_names_the_verdict_and_the_peak() -> None:
    assert probe_line(FITS) == "probe 8: fits, peak 4 MiB, 0.50 s"
    assert probe_line(OVER) == "probe 16: over budget, peak 9 MiB, 0.00 s"
    assert probe_line(OOM) == "probe 32: out of memory, 0.25 s"


def test_probe_table_has_a_row_per_probe() -> None:
    text = render(probe_table([FITS, OVER, OOM], title="Probes"))
    assert "Probes" in text
    rows = [line for line in text.splitlines() if "│" in line and "micro" not in line]
    assert len(rows) == 3
    assert "yes" in rows[0]
    assert "3 MiB" in rows[0]
    assert "1,234.5" in rows[0]
    assert "no" in rows[1]
    assert "OOM" in rows[2]
    assert "-" in rows[2]


def test_live_progress_prints_one_line_per_probe_off_a_terminal() -> None:
    buffer = io.StringIO()
    with LiveProgress(console_to(buffer)) as progress:
        progress.probe_started(8)
        progress.probe_finished(FITS)
        progress.probe_started(32)
        progress.probe_finished(OOM)
    assert buffer.getvalue().splitlines() == [probe_line(FITS), probe_line(OOM)]
    assert progress.probes == [FITS, OOM]


def test_live_progress_on_a_terminal_draws_a_live_table_and_clears_it() -> None:
    buffer = io.StringIO()
    with LiveProgress(console_to(buffer, terminal=True)) as progress:
        progress.probe_started(8)
        progress.probe_finished(FITS)
        progress.probe_started(16)
        assert progress.current == 16
    drawn = buffer.getvalue()
    # The last frame shows the finished probe's row and a spinner for the running one ...
    assert "probing micro batch 16" in drawn
    assert "1,234.5" in drawn
    # ... and no one-line-per-probe output, which is for pipes.
    assert probe_line(FITS) not in drawn
    # Transient: the frame is erased at the end (cursor up, clear line).
    assert drawn.endswith("\x1b[2K")
    assert progress.probes == [FITS]


def _profile(found: int, *, size_cap: int = 4096, fit: AffineFit | None = None) -> Profile:
    return Profile(
        workload_key="w" * 24,
        device_key="d" * 24,
        workload=WorkloadInfo(
            name="mlp-2x64",
            precision="fp32",
            activation_checkpointing=False,
            parameter_count=10,
            optimizer="AdamW",
        ),
        device=DeviceInfo(kind="cpu", name="x86_64", capacity_bytes=16 * 2**20),
        headroom=0.05,
        budget_bytes=int(0.95 * 16 * 2**20),
        strategy="model",
        size_cap=size_cap,
        max_micro_batch_size=found,
        probes=[FITS, OVER],
        fit=fit,
        settings=ProbeSettings(),
        wall_time_s=1.5,
    )


def test_print_profile_reports_keys_fit_answer_and_recommendation() -> None:
    fit = AffineFit(fixed_bytes=2 * 2**20, bytes_per_sample=2**17, points=2)
    plan = recommend(max_micro_batch_size=8, probes=[FITS], global_batch_size=20)
    buffer = io.StringIO()
    print_profile(console_to(buffer, width=200), _profile(8, fit=fit), plan)
    text = buffer.getvalue()
    assert "w" * 24 in text
    assert "d" * 24 in text
    assert "2 MiB + 128 KiB × micro batch" in text
    assert "estimated" in text  # the fit is a model, not a measurement
    assert "largest micro batch that fits: 8" in text
    assert "(the --max cap)" not in text
    assert "for global batch 20:" in text
    assert "2×7 + 6" in text  # balanced: 3 micro batches, within one of each other
    assert "why       balanced: the fewest micro batches that fit M* = 8" in text


def test_print_profile_marks_an_answer_bound_by_the_cap() -> None:
    buffer = io.StringIO()
    print_profile(console_to(buffer, width=200), _profile(8, size_cap=8), None)
    text = buffer.getvalue()
    assert "largest micro batch that fits: 8 (the --max cap)" in text
    assert "fit " not in text  # no fit line without a fit


def test_the_rank_table_places_each_rank_on_its_mesh() -> None:
    parts = MemoryBreakdown(
        parameters_bytes=1, gradients_bytes=1, optimizer_state_bytes=2, activations_bytes=4
    )
    probe = FITS.model_copy(
        update={"rank_peaks_bytes": [2**20] * 4, "rank_breakdowns": [parts] * 4}
    )
    text = render(rank_table(probe, MeshShape(4, 2)))
    for label in ("0 (dp 0, tp 0)", "1 (dp 0, tp 1)", "2 (dp 1, tp 0)", "3 (dp 1, tp 1)"):
        assert label in text
    flat = render(rank_table(probe, MeshShape(4)))
    assert "(dp" not in flat
