"""Devices, workloads and profiles. A profile is written whole, with its device, workload
and probes, inside the caller's one transaction, or not at all."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from api import models
from tuner import results


def upsert_device(session: Session, key: str, info: results.DeviceInfo) -> models.Device:
    """The device with ``key``, created from ``info`` if new (a key names its properties)."""
    device = session.scalar(select(models.Device).where(models.Device.key == key))
    if device is None:
        device = models.Device(
            key=key,
            kind=info.kind,
            name=info.name,
            capacity_bytes=info.capacity_bytes,
            details=dict(info.details),
        )
        session.add(device)
        session.flush()
    return device


def upsert_workload(session: Session, key: str, info: results.WorkloadInfo) -> models.Workload:
    """The workload with ``key``, created from ``info`` if new."""
    workload = session.scalar(select(models.Workload).where(models.Workload.key == key))
    if workload is None:
        workload = models.Workload(
            key=key,
            name=info.name,
            target=info.target,
            precision=info.precision,
            activation_checkpointing=info.activation_checkpointing,
            parameter_count=info.parameter_count,
            optimizer=info.optimizer,
        )
        session.add(workload)
        session.flush()
    return workload


def add_profile(session: Session, profile: results.Profile) -> models.Profile:
    """Store ``profile`` with its probes; older profiles of the pair stay as history."""
    device = upsert_device(session, profile.device_key, profile.device)
    workload = upsert_workload(session, profile.workload_key, profile.workload)
    row = models.Profile(
        workload=workload,
        device=device,
        created_at=profile.created_at,
        headroom=profile.headroom,
        budget_bytes=profile.budget_bytes,
        strategy=profile.strategy,
        size_cap=profile.size_cap,
        max_micro_batch_size=profile.max_micro_batch_size,
        fit_fixed_bytes=profile.fit.fixed_bytes if profile.fit else None,
        fit_bytes_per_sample=profile.fit.bytes_per_sample if profile.fit else None,
        fit_points=profile.fit.points if profile.fit else None,
        settings=profile.settings.model_dump(mode="json"),
        oversize_probe=(
            profile.oversize_probe.model_dump(mode="json") if profile.oversize_probe else None
        ),
        wall_time_s=profile.wall_time_s,
        probes=[
            models.Probe(
                ordinal=index,
                micro_batch_size=probe.micro_batch_size,
                fits=probe.fits,
                oom=probe.oom,
                peak_allocated_bytes=probe.peak_allocated_bytes,
                peak_reserved_bytes=probe.peak_reserved_bytes,
                non_torch_bytes=probe.non_torch_bytes,
                alloc_retries=probe.alloc_retries,
                phase_peaks_bytes=dict(probe.phase_peaks_bytes),
                breakdown=probe.breakdown.model_dump(mode="json") if probe.breakdown else None,
                step_time_s=probe.step_time_s,
                samples_per_second=probe.samples_per_second,
                steps_run=probe.steps_run,
                wall_time_s=probe.wall_time_s,
                error=probe.error,
            )
            for index, probe in enumerate(profile.probes)
        ],
    )
    session.add(row)
    session.flush()
    return row


def to_result(row: models.Profile) -> results.Profile:
    """The stored profile as the engine's own schema (what the client and plan take)."""
    fit = None
    if row.fit_fixed_bytes is not None and row.fit_bytes_per_sample is not None:
        fit = results.AffineFit(
            fixed_bytes=row.fit_fixed_bytes,
            bytes_per_sample=row.fit_bytes_per_sample,
            points=row.fit_points or 0,
        )
    return results.Profile(
        workload_key=row.workload.key,
        device_key=row.device.key,
        workload=results.WorkloadInfo(
            name=row.workload.name,
            target=row.workload.target,
            precision=row.workload.precision,
            activation_checkpointing=row.workload.activation_checkpointing,
            parameter_count=row.workload.parameter_count,
            optimizer=row.workload.optimizer,
        ),
        device=results.DeviceInfo(
            kind=row.device.kind,
            name=row.device.name,
            capacity_bytes=row.device.capacity_bytes,
            details=row.device.details,
        ),
        headroom=row.headroom,
        budget_bytes=row.budget_bytes,
        strategy=row.strategy,
        size_cap=row.size_cap,
        max_micro_batch_size=row.max_micro_batch_size,
        probes=[
            results.ProbeResult(
                micro_batch_size=p.micro_batch_size,
                fits=p.fits,
                oom=p.oom,
                peak_allocated_bytes=p.peak_allocated_bytes,
                peak_reserved_bytes=p.peak_reserved_bytes,
                non_torch_bytes=p.non_torch_bytes,
                alloc_retries=p.alloc_retries,
                phase_peaks_bytes=p.phase_peaks_bytes,
                breakdown=results.MemoryBreakdown.model_validate(p.breakdown)
                if p.breakdown
                else None,
                step_time_s=p.step_time_s,
                samples_per_second=p.samples_per_second,
                steps_run=p.steps_run,
                wall_time_s=p.wall_time_s,
                error=p.error,
            )
            for p in row.probes
        ],
        oversize_probe=results.ProbeResult.model_validate(row.oversize_probe)
        if row.oversize_probe
        else None,
        fit=fit,
        settings=results.ProbeSettings.model_validate(row.settings),
        wall_time_s=row.wall_time_s,
        created_at=row.created_at,
    )
