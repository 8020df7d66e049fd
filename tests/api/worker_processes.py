"""Real ``tuner worker`` processes for the API's tests: started in their own process
groups and killed, group and all, when the test ends; and what /proc says of them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.engine.backends import make_backend
from tuner.engine.fingerprint import device_key

REPO = Path(__file__).resolve().parents[2]
MEMORY_LIMIT = 64 * 2**20
CPU_KEY = device_key(make_backend("cpu", memory_limit_bytes=MEMORY_LIMIT))
SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


class Workers:
    """``tuner worker`` subprocesses, each leading its own process group; whatever is left
    of them is killed, group and all, when the test ends."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[subprocess.Popen[bytes]] = []

    def start(
        self,
        url: str,
        token: str | None,
        *args: str,
        name: str,
        allow: str = "tests.job_workloads",
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """A worker allowed to run ``allow``; with no ``token``, it takes TUNER_TOKEN from
        ``env``."""
        command = [sys.executable, "-m", "tuner.cli", "worker", "--url", url]
        command += ["--token", token] if token else []
        command += ["--device", "cpu", "--memory-limit", str(MEMORY_LIMIT)]
        command += ["--poll-interval", "0.2", "--name", name, "--allow", allow, *args]
        with (self.logs / f"{name}.log").open("wb") as log:
            process = subprocess.Popen(
                command,
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started.append(process)
        return process

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def close(self) -> None:
        for process in self.started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def children_of(pid: int) -> list[int]:
    """Live child processes of ``pid`` (from /proc, so no extra dependency)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while we looked
        state, parent = fields[0], int(fields[1])
        if parent == pid and state != "Z":
            found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; only its parent has not reaped it yet
