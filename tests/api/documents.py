"""Profile documents written out by hand: plain data in the shape the engine produces."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tuner.core.results import (
    AffineFit,
    DeviceInfo,
    MemoryBreakdown,
    ProbeResult,
    ProbeSettings,
    Profile,
    WorkloadInfo,
)

MiB = 2**20


def sample_probe(
    size: int, *, fits: bool, fixed: int = 100 * MiB, slope: int = 10 * MiB
) -> ProbeResult:
    peak = fixed + slope * size
    return ProbeResult(
        micro_batch_size=size,
        fits=fits,
        peak_allocated_bytes=peak,
        peak_reserved_bytes=peak,
        phase_peaks_bytes={"accumulate": peak, "optimizer": fixed},
        breakdown=MemoryBreakdown(
            parameters_bytes=fixed // 4,
            gradients_bytes=fixed // 4,
            optimizer_state_bytes=fixed // 2,
            activations_bytes=slope * size,
        ),
        step_time_s=0.01 * size + 0.05,
        samples_per_second=2 * size / (0.01 * size + 0.05),
        steps_run=4,
        wall_time_s=0.1,
    )


def sample_profile(
    *,
    max_micro_batch_size: int = 8,
    workload_key: str = "w" * 24,
    device_key: str = "d" * 24,
    workload_name: str = "gpt-test",
    device_name: str = "cpu-test",
    capacity_bytes: int = 200 * MiB,
    created_at: datetime | None = None,
) -> Profile:
    found = max_micro_batch_size
    sizes = sorted({1, found, found + 1} - {0})
    probes = [sample_probe(m, fits=m <= found) for m in sizes]
    return Profile(
        workload_key=workload_key,
        device_key=device_key,
        workload=WorkloadInfo(
            name=workload_name,
            target="examples.gpt:workload",
            precision="fp32",
            activation_checkpointing=False,
            parameter_count=1_000_000,
            optimizer="AdamW",
        ),
        device=DeviceInfo(
            kind="cpu",
            name=device_name,
            capacity_bytes=capacity_bytes,
            details={"memory_limit_bytes": capacity_bytes, "torch": "2.13.0"},
        ),
        headroom=0.05,
        budget_bytes=int(0.95 * capacity_bytes),
        strategy="model",
        size_cap=4096,
        max_micro_batch_size=found,
        probes=probes,
        fit=AffineFit(fixed_bytes=100 * MiB, bytes_per_sample=10 * MiB, points=len(probes)),
        settings=ProbeSettings(),
        wall_time_s=1.5,
        created_at=created_at or datetime(2026, 11, 1, tzinfo=UTC) + timedelta(minutes=found),
    )


def profile_with_peaks(
    max_micro_batch_size: int, peaks: dict[int, int], budget: int, **update: object
) -> Profile:
    """A sample profile whose probes ran at the sizes of ``peaks`` with those peaks (every
    phase at the same peak), measured against ``budget``."""
    base = sample_profile(max_micro_batch_size=max_micro_batch_size)
    probes = [
        base.probes[0].model_copy(
            update={
                "micro_batch_size": m,
                "fits": value <= budget,
                "peak_allocated_bytes": value,
                "peak_reserved_bytes": value,
                "phase_peaks_bytes": {"accumulate": value},
            }
        )
        for m, value in sorted(peaks.items())
    ]
    return base.model_copy(update={"probes": probes, "budget_bytes": budget, **update})
