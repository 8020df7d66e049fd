"""Real services for tests: a throwaway PostgreSQL cluster and a uvicorn server in a thread.

PostgreSQL comes from ``TUNER_TEST_POSTGRES_URL`` when set; otherwise a private cluster
is started from the installed server binaries (Debian's ``postgresql`` package, which
``.ci/run`` installs). Where neither exists the PostgreSQL tests skip, except under
``CI=true``, where they fail: CI must run them.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _postgres_bin() -> Path | None:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if candidates:
        return Path(candidates[0]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _as_postgres_user() -> list[str]:
    # The server refuses to run as root; Debian's package provides the postgres user.
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--"]
    return []


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[str]:
    """Start a private cluster on a free port; yield a URL for a superuser database."""
    configured = os.environ.get("TUNER_TEST_POSTGRES_URL")
    if configured:
        yield configured
        return
    bindir = _postgres_bin()
    if bindir is None:
        message = "PostgreSQL server binaries not found (apt-get install postgresql)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + ": CI must run the PostgreSQL tests")
        pytest.skip(message)
    root = Path(tempfile.mkdtemp(prefix="tuner-pg-"))
    data, sockets = root / "data", root / "sock"
    sockets.mkdir()
    runner = _as_postgres_user()
    if runner:
        shutil.chown(root, "postgres")
        shutil.chown(sockets, "postgres")
    port = free_port()
    subprocess.run(
        [
            *runner,
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "tuner",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
        ],
        check=True,
        capture_output=True,
    )
    options = (
        f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
    )
    subprocess.run(
        [
            *runner,
            str(bindir / "pg_ctl"),
            "-D",
            str(data),
            "-o",
            options,
            "-w",
            "-l",
            str(root / "log"),
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql://tuner@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*runner, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)


class ServerThread:
    """A real uvicorn server for ``app`` on a free loopback port, in a daemon thread."""

    def __init__(self, app: FastAPI) -> None:
        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        # Readiness is polled; the bound only turns a server that never starts into a failure.
        deadline = time.monotonic() + 120
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start within 120 seconds")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@contextlib.contextmanager
def tuner_serve(
    database_url: str,
    *arguments: str,
    open_files: int | None = None,
    stderr_lines: list[str] | None = None,
) -> Iterator[str]:
    """`tuner serve` in its own process(es), as deployed; yield its base URL. Anything the
    server logs on the way (a traceback, "database is locked") fails the test.
    ``open_files``: the server starts with that soft limit on open files (RLIMIT_NOFILE).
    ``stderr_lines`` receives what the server writes on stderr (its access log), as it
    writes it: read all along, so that a long test never fills the pipe."""
    port = free_port()
    command = [sys.executable, "-m", "tuner.cli", "serve", "--port", str(port), *arguments]

    def limit_open_files() -> None:
        import resource

        assert open_files is not None
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, hard))

    server = subprocess.Popen(
        [*command, "--database-url", database_url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limit_open_files if open_files is not None else None,
    )
    lines = stderr_lines if stderr_lines is not None else []
    stderr = server.stderr
    assert stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(stderr), daemon=True)
    reader.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180  # polled: only a server that never starts fails
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                server.wait(timeout=30)
                reader.join(timeout=10)
                raise RuntimeError(f"tuner serve did not start: {''.join(lines)}")
            time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
        reader.join(timeout=10)
        stderr.close()
        errors = "".join(lines)
        assert "Traceback" not in errors, errors
        assert "locked" not in errors, errors
