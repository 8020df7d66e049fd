"""Helpers for tests that run the real interpreter and the real ``tuner`` command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def scaled(seconds: float) -> float:
    """A wall-clock bound for a test, stretched by how busy the machine is: ``seconds`` on a
    quiet machine, times the load per core beyond one (a suite run beside another CPU-heavy
    process must not fail on a bound a quiet run meets), and twice that under ``CI=true``."""
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    return seconds * max(1.0, load) * (2.0 if os.environ.get("CI") == "true" else 1.0)


def subprocess_env() -> dict[str, str]:
    """The environment of a child process that imports the repo's packages and tests."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH", "")])]
    )
    # Output goes to pipes, as in CI and scripts: no terminal, no colour, default width.
    for name in ("FORCE_COLOR", "COLUMNS", "LINES"):
        env.pop(name, None)
    env["TERM"] = "dumb"
    # One torch thread, as in this process (see conftest.py).
    env["OMP_NUM_THREADS"] = "1"
    return env


def run_python(code: str, *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter of this virtualenv, from the repo root."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def tuner_executable() -> Path:
    """The ``tuner`` console script installed next to this interpreter."""
    return Path(sys.executable).parent / "tuner"


def run_tuner(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the real ``tuner`` command as a subprocess from the repo root."""
    return subprocess.run(
        [str(tuner_executable()), *args],
        cwd=REPO_ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
