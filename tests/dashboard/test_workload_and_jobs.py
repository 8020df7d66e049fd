"""One workload across devices (measured and estimated side by side, as the recommendation
endpoint estimates), and the jobs and workers page (queued, running and failed jobs with
their reasons; workers with their device and last heartbeat)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from api import models
from api.db import Database
from tests.api.conftest import make_token
from tests.dashboard.conftest import Tab, signed_in
from tests.dashboard.data import (
    T0,
    GiB,
    api,
    claim,
    cuda_profile,
    fail,
    queue_job,
    register_worker,
    store,
)
from tests.services import ServerThread


@pytest.mark.slow
def test_a_workload_compares_devices_and_marks_estimates(
    tab: Tab, database: Database, reader: str, writer: str, service: ServerThread
) -> None:
    a100 = cuda_profile()
    h100 = cuda_profile(created_at=T0 + timedelta(hours=1), device_name="NVIDIA H100 80GB")
    h100 = h100.model_copy(
        update={
            "device_key": "h100".ljust(24, "z"),
            "device": h100.device.model_copy(update={"capacity_bytes": 80 * GiB}),
            "max_micro_batch_size": 48,  # measured lower than its memory allows: no estimate
        }
    )
    a100_id, h100_id = store(database, [a100, h100])
    with api(service.url, writer) as client:
        created = client.post(
            "/api/v1/devices",
            json={
                "key": "l4".ljust(24, "q"),
                "kind": "cuda",
                "name": "NVIDIA L4",
                "capacity_bytes": 24 * GiB,
            },
        )
        assert created.status_code == 201
        estimate = client.get(
            "/api/v1/recommendation",
            params={
                "workload": a100.workload_key,
                "device": "NVIDIA L4",
                "global_batch_size": 2**20,
            },
        ).json()
    assert estimate["basis"] == "estimated"

    page = signed_in(tab, reader).open("/workloads")
    page.click("text=llama-1b")
    page.wait_for_url("**/workloads/*")
    cards = page.locator(".device-card").evaluate_all(
        "cards => cards.map(c => [c.querySelector('h2').innerText, c.dataset.basis, "
        "c.dataset.mstar])"
    )
    assert cards == [
        ["NVIDIA A100 40GB", "measured", "56"],
        ["NVIDIA H100 80GB", "measured", "48"],
        ["NVIDIA L4", "estimated", str(estimate["max_micro_batch_size"])],
    ]
    l4 = page.locator(".device-card[data-basis=estimated]")
    assert "estimated" in l4.locator(".badge").inner_text()
    assert f"profile #{h100_id}" in l4.inner_text()  # the newest fit, as the API chose it
    assert f"#{estimate['profile_id']}" in l4.inner_text()
    measured = page.locator(".device-card[data-basis=measured]").first
    assert "91.8/s" in measured.inner_text()  # samples per second at M* = 56
    assert f"#{a100_id}" in measured.inner_text()
    tab.screenshot("workload")
    tab.open("/workloads")
    tab.screenshot("workloads")


def test_jobs_and_workers_show_state_reasons_and_heartbeats(
    tab: Tab, database: Database, reader: str, writer: str, service: ServerThread
) -> None:
    worker_token = make_token(database, "worker", name="worker")
    with api(service.url, worker_token) as workers, api(service.url, writer) as people:
        busy = register_worker(workers, "gpu-host-1", "NVIDIA H100 80GB HBM3")
        quiet = register_worker(workers, "gpu-host-2", "NVIDIA A100 40GB")
        first = queue_job(people, "NVIDIA H100 80GB HBM3", precision="bf16")
        broken = queue_job(people, "NVIDIA H100 80GB HBM3")
        waiting = queue_job(people, "NVIDIA A100 40GB")
        running = claim(workers, busy["id"])
        assert running["job"]["id"] == first["id"]
        failing = claim(workers, quiet["id"])  # the A100 host takes the A100 job
        assert failing["job"]["id"] == waiting["id"]
        fail(workers, failing, "ModuleNotFoundError: No module named 'examples'")
    with database.session(write=True) as session:
        session.execute(
            update(models.Worker)
            .where(models.Worker.id == quiet["id"])
            .values(last_heartbeat_at=models.utcnow() - timedelta(minutes=10))
        )

    page = signed_in(tab, reader).open("/jobs")
    counts = {
        kind: page.locator(f"[data-count={kind}] strong").inner_text()
        for kind in ("running", "queued", "failed", "succeeded")
    }
    assert counts == {"running": "1", "queued": "1", "failed": "1", "succeeded": "0"}
    running_row = page.locator(f"#jobs-running tr[data-job-id='{first['id']}']")
    assert "gpu-host-1" in running_row.inner_text()
    assert "precision=bf16" in running_row.inner_text()
    assert page.locator(f"#jobs-queued tr[data-job-id='{broken['id']}']").count() == 1
    failed_row = page.locator(f"#jobs-failed tr[data-job-id='{waiting['id']}']")
    assert "No module named 'examples'" in failed_row.inner_text()
    assert "not retried" in failed_row.inner_text()
    workers_rows = page.locator("#workers-table tbody tr").evaluate_all(
        "rows => rows.map(r => [r.cells[0].innerText, r.cells[1].innerText, r.dataset.state])"
    )
    assert [row[0] for row in workers_rows] == ["gpu-host-1", "gpu-host-2"]
    assert workers_rows[0][1].startswith("NVIDIA H100 80GB HBM3")
    assert [row[2] for row in workers_rows] == ["alive", "silent"]
    assert "10 min ago" in page.locator(f"tr[data-worker-id='{quiet['id']}']").inner_text()
    assert f"job #{first['id']}" in page.locator(f"tr[data-worker-id='{busy['id']}']").inner_text()
    tab.screenshot("jobs")


def test_the_jobs_page_refreshes_itself(
    tab: Tab, database: Database, reader: str, writer: str, service: ServerThread
) -> None:
    signed_in(tab, reader)
    tab.page.clock.install()
    page = tab.open("/jobs")
    assert page.locator("#empty-jobs").count() == 1
    with api(service.url, writer) as people:
        queue_job(people, "NVIDIA H100 80GB HBM3")
    with page.expect_response(lambda r: r.url.endswith("/jobs")):
        page.clock.run_for(11_000)
    page.wait_for_selector("#jobs-queued tbody tr")
    assert page.locator("[data-count=queued] strong").inner_text() == "1"
