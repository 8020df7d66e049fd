"""Screenshots of every page kind of the dashboard, for the README: the store of
``tests/dashboard/test_landing.py`` (three runs of one model, explored variants, three
sequence lengths, nothing fits, a GPU with an out-of-memory report) plus a few jobs and
workers, served for real and shot in Chromium at 1440×900 and 390×844 (the top of each
page, as a reader first sees it; the variants panel of an explored profile; the memory
timeline of a profile measured for real).

    python -m tests.dashboard.screenshots docs/screenshots
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from tests.dashboard.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.dashboard.data import api, claim, fail, queue_job, register_worker
from tests.dashboard.test_landing import VIEWPORTS, _fleet
from tests.timeline_profiles import measured_profile


def main(target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as directory:
        fleet_of = _fleet(f"sqlite:///{Path(directory) / 'tuner.db'}", "sqlite")
        fleet = next(fleet_of)
        with api(fleet.url, fleet.token) as client:
            worker = register_worker(client, "gpu-box-1", "NVIDIA A100 80GB")
            register_worker(client, "gpu-box-2", "NVIDIA H100 80GB")
            # By the worker's device key: the store's profiled A100 has the same name.
            a100 = worker["device_key"]
            queue_job(client, a100, seq_len=512)
            fail(client, claim(client, worker["id"]), "CUDA driver 535 is too old for torch 2.13")
            queue_job(client, a100, layers=8)
            queue_job(client, "NVIDIA H100 80GB")
            workload_id = client.get(f"/api/v1/profiles/{fleet.ids['ddp2']}").json()["workload_id"]
            # A profile measured for real, with the memory timeline of its step at M*.
            uploaded = client.post(
                "/api/v1/profiles", json=measured_profile().model_dump(mode="json")
            )
            uploaded.raise_for_status()
            timeline_id = uploaded.json()["id"]
        pages = {
            "landing": "/",
            "profiles": "/profiles",
            "profile": f"/profiles/{fleet.ids['gpu']}",
            "profile-ddp": f"/profiles/{fleet.ids['ddp2']}",
            # Scrolled to the variants compared, the one the exploration chose marked.
            "profile-variants": f"/profiles/{fleet.ids['variant1']}#variants",
            # Scrolled to the memory over the step at M*, its phases and peak.
            "profile-timeline": f"/profiles/{timeline_id}#timeline",
            "workloads": "/workloads",
            "workload": f"/workloads/{workload_id}",
            # Scrolled to M* against world size: DDP at 2 and 4 ranks, one process.
            "workload-world-sizes": f"/workloads/{workload_id}#world-sizes",
            "family": "/families/" + "gpt-len".ljust(24, "f"),
            "devices": "/devices",
            "jobs": "/jobs",
            "failures": "/failures",
            "compare": f"/compare?a={fleet.ids['one']}&b={fleet.ids['ddp2']}",
            "not-found": "/no/such/page",
        }
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            for label, (width, height) in VIEWPORTS.items():
                context = browser.new_context(viewport={"width": width, "height": height})
                page = context.new_page()
                page.goto(fleet.url + "/login")
                page.screenshot(path=str(target / f"login-{label}.png"))
                context.add_cookies(
                    [{"name": "tuner_token", "value": fleet.token, "url": fleet.url}]
                )
                for name, path in pages.items():
                    page.goto(fleet.url + path)
                    page.wait_for_load_state("load")
                    page.wait_for_timeout(400)  # charts draw on the next frames
                    page.screenshot(path=str(target / f"{name}-{label}.png"))
                context.close()
            browser.close()
        fleet_of.close()


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/screenshots"))
