"""Profiles, jobs and workers for the dashboard's tests, stored for real."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from api.db import Database
from api.store.profiles import add_profile
from api.store.projects import ensure_project
from tests.api.documents import MiB, sample_probe, sample_profile
from tuner.core.results import (
    AffineFit,
    DeviceInfo,
    MemoryBreakdown,
    ProbeResult,
    ProbeSettings,
    Profile,
    WorkloadInfo,
)

GiB = 1024 * MiB
T0 = datetime(2026, 11, 1, tzinfo=UTC)


def store(
    database: Database, profiles: Iterable[Profile], *, project: str = "default"
) -> list[int]:
    """Store the profiles in one transaction, in ``project``; their ids, in order."""
    with database.session(write=True) as session:
        project_id = ensure_project(session, project).id
        return [add_profile(session, profile, project_id=project_id).id for profile in profiles]


def fleet(count: int, *, workloads: int = 10, devices: int = 5) -> list[Profile]:
    """``count`` profiles over ``workloads × devices`` pairs, each pair with its history."""
    profiles = []
    for index in range(count):
        w, d = index % workloads, (index // workloads) % devices
        profiles.append(
            sample_profile(
                max_micro_batch_size=1 + (index * 7) % 40,
                workload_key=f"wl{w:02d}".ljust(24, "w"),
                workload_name=f"model-{w:02d}",
                device_key=f"dv{d:02d}".ljust(24, "d"),
                device_name=f"device-{d:02d}",
                capacity_bytes=(512 + 256 * d) * MiB,
                created_at=T0 + timedelta(minutes=index),
            )
        )
    return profiles


def cuda_probe(
    size: int,
    *,
    fits: bool,
    oom: bool = False,
    fixed: int = 6 * GiB,
    slope: int = 565 * MiB,
    outside: int = 512 * MiB,
) -> ProbeResult:
    """A probe as the CUDA backend records it: the caching allocator reserves more than
    it allocates, the CUDA context lives outside torch, and an OOM stops the step."""
    if oom:
        return ProbeResult(
            micro_batch_size=size, fits=False, oom=True, non_torch_bytes=outside, steps_run=1
        )
    allocated = fixed + slope * size
    reserved = allocated + 256 * MiB + (size % 3) * 64 * MiB
    return ProbeResult(
        micro_batch_size=size,
        fits=fits,
        peak_allocated_bytes=allocated,
        peak_reserved_bytes=reserved,
        non_torch_bytes=outside,
        phase_peaks_bytes={"accumulate": allocated, "optimizer": fixed},
        breakdown=MemoryBreakdown(
            parameters_bytes=fixed // 6,
            gradients_bytes=fixed // 6,
            optimizer_state_bytes=fixed // 3,
            activations_bytes=allocated - (fixed // 6) * 2 - fixed // 3,
            allocator_cache_bytes=reserved - allocated,
        ),
        step_time_s=0.02 * size + 0.1,
        samples_per_second=2 * size / (0.02 * size + 0.1),
        steps_run=4,
        wall_time_s=1.2,
    )


def cuda_profile(*, created_at: datetime = T0, device_name: str = "NVIDIA A100 40GB") -> Profile:
    """A 40 GiB GPU searched as the model strategy would: 1, 8, 64 (out of memory, so no
    peak), 32, 48, 60 (out of memory), 56 (M*), 57 (ran, over the budget)."""
    capacity = 40 * GiB
    headroom = 0.05
    budget = int((1 - headroom) * capacity)
    sizes = [(1, True), (8, True), (64, None), (32, True), (48, True), (60, None), (56, True)]
    sizes.append((57, False))
    probes = []
    for size, fits in sizes:
        if fits is None:
            probes.append(cuda_probe(size, fits=False, oom=True))
        else:
            probes.append(cuda_probe(size, fits=fits))
    measured = [(p.micro_batch_size, p.footprint_bytes) for p in probes if p.footprint_bytes]
    fit = AffineFit.through([(m, y) for m, y in measured if y is not None])
    return Profile(
        workload_key="llama" + "x" * 19,
        device_key="a100" + "y" * 20,
        workload=WorkloadInfo(
            name="llama-1b",
            target="examples.gpt:workload",
            precision="bf16",
            activation_checkpointing=False,
            parameter_count=1_100_000_000,
            optimizer="AdamW",
        ),
        device=DeviceInfo(
            kind="cuda",
            name=device_name,
            capacity_bytes=capacity,
            details={"torch": "2.13.0", "cuda": "12.8", "compute_capability": "8.0"},
        ),
        headroom=headroom,
        budget_bytes=budget,
        strategy="model",
        size_cap=4096,
        max_micro_batch_size=56,
        probes=probes,
        fit=fit,
        settings=ProbeSettings(),
        wall_time_s=95.0,
        created_at=created_at,
    )


def nothing_fits_profile() -> Profile:
    base = sample_profile(max_micro_batch_size=0, workload_name="huge", workload_key="h" * 24)
    return base.model_copy(
        update={"probes": [sample_probe(1, fits=False, fixed=300 * MiB)], "fit": None}
    )


# Jobs and workers, through the API as workers and people use it


def api(base_url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def register_worker(client: httpx.Client, name: str, device_name: str) -> dict[str, Any]:
    response = client.post(
        "/api/v1/workers",
        json={
            "name": name,
            "device_key": ("k" + device_name.replace(" ", "")).ljust(24, "k")[:24],
            "device": {"kind": "cuda", "name": device_name, "capacity_bytes": 80 * GiB},
        },
    )
    assert response.status_code == 201, response.text
    worker: dict[str, Any] = response.json()
    return worker


def queue_job(client: httpx.Client, device: str, **options: Any) -> dict[str, Any]:
    response = client.post(
        "/api/v1/jobs",
        json={"target": "examples.gpt:workload", "device": device, "options": options},
    )
    assert response.status_code == 201, response.text
    job: dict[str, Any] = response.json()
    return job


def claim(client: httpx.Client, worker_id: int) -> dict[str, Any]:
    response = client.post(f"/api/v1/workers/{worker_id}/claim")
    assert response.status_code == 200, response.text
    claimed: dict[str, Any] = response.json()
    return claimed


def fail(client: httpx.Client, claimed: dict[str, Any], reason: str) -> None:
    response = client.post(
        f"/api/v1/jobs/{claimed['job']['id']}/failure",
        json={"lease_id": claimed["lease"]["lease_id"], "reason": reason, "retryable": False},
    )
    assert response.status_code == 200, response.text
