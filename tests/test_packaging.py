"""What the service image relies on, checked for real: a clean environment with only the
``server`` extra (no torch) installs from this checkout, carries its migrations, and
serves. Docker itself cannot run here, so the Dockerfile's own promises are read below."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.services import free_port

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_server_extra_installs_without_torch_and_serves(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"{ROOT}[server]"],
        check=True,
        capture_output=True,
    )
    check = "import sys, api.main, tuner.core.plan, tuner.client; assert 'torch' not in sys.modules"
    subprocess.run([str(python), "-c", check], check=True, cwd=tmp_path)
    listed = subprocess.run(
        [str(python), "-m", "pip", "list"], check=True, capture_output=True, text=True
    ).stdout
    assert "torch" not in listed.lower()

    port = free_port()
    env = {
        **os.environ,
        "TUNER_DATABASE_URL": f"sqlite:///{tmp_path / 'data' / 'tuner.db'}",
        "TUNER_PORT": str(port),
    }
    server = subprocess.Popen([str(venv / "bin" / "tuner"), "serve"], env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert server.poll() is None, "tuner serve exited"
                assert time.monotonic() < deadline, "tuner serve did not answer in 30 s"
                time.sleep(0.2)
        assert response.status_code == 200
        assert (tmp_path / "data" / "tuner.db").exists()  # created and migrated on start
        # /docs and /redoc are served from files the wheel carries (no CDN).
        for path in (
            "/docs",
            "/redoc",
            "/docs/assets/swagger-ui/swagger-ui-bundle.js",
            "/docs/assets/redoc/redoc.standalone.js",
        ):
            assert httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5).status_code == 200, path
    finally:
        server.terminate()
        server.wait(timeout=10)
    # Without torch, profiling says in one line which extra to install.
    profiled = subprocess.run(
        [str(venv / "bin" / "tuner"), "profile", "examples.gpt:workload", "--device", "cpu"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert profiled.returncode == 2, profiled.stderr
    assert profiled.stderr.strip() == (
        "tuner profile needs the torch extra (torch not installed): "
        "pip install -e '.[torch]' in your clone of microbatch-tuner"
    )


def test_dockerfile_service_image_has_no_torch_runs_as_a_user_and_checks_health() -> None:
    text = (ROOT / "Dockerfile").read_text()
    service = text.split("AS service", 1)[1].split("FROM ", 1)[0]
    assert "'.[server]'" in service
    assert "torch" not in service.replace("no torch", "")
    assert "USER tuner" in service
    assert "HEALTHCHECK" in service
    assert 'VOLUME ["/data"]' in service
    assert "tuner db upgrade && exec tuner serve" in service
    worker = text.split("AS worker", 1)[1]
    assert "torch==" in worker
    assert "USER tuner" in worker
