"""Slow readers against `tuner serve`: connections that each pipeline 40 requests for the
OpenAPI document and never read, against a process with a hard open-file limit. Prints
`/healthz`'s latency while they are held, and the sockets the server holds over time.

    .venv/bin/python bench/slow_readers.py --connections 600 --open-files 512

Each connection has a small receive window (4 KiB, 536-byte segments), so the server's
writes back up within two answers as they do for a far client; on loopback the kernel
would otherwise queue megabytes for each. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REQUEST = b"GET /openapi.json HTTP/1.1\r\nHost: tuner\r\n\r\n"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _sockets_of(pid: int) -> int:
    fds = Path(f"/proc/{pid}/fd")
    return sum(os.readlink(fd).startswith("socket:") for fd in fds.iterdir())


def _not_reading(port: int, pipelined: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    sock.settimeout(5)
    try:
        sock.connect(("127.0.0.1", port))
        sock.sendall(REQUEST * pipelined)
    except OSError:
        pass  # refused or reset: the server is out of room, which is what is measured
    return sock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=600)
    parser.add_argument("--pipelined", type=int, default=40)
    parser.add_argument("--open-files", type=int, default=512, help="soft and hard limit")
    args = parser.parse_args()

    directory = tempfile.mkdtemp(prefix="tuner-slow-readers-")
    url = f"sqlite:///{directory}/tuner.db"
    tuner = [sys.executable, "-m", "tuner.cli"]
    subprocess.run([*tuner, "db", "--database-url", url, "upgrade"], check=True)
    port = _free_port()

    def limit_open_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (args.open_files, args.open_files))

    server = subprocess.Popen(
        [*tuner, "serve", "--port", str(port), "--database-url", url, "--no-access-log"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=limit_open_files,
    )
    held: list[socket.socket] = []
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(base + "/healthz", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        held = [_not_reading(port, args.pipelined) for _ in range(args.connections)]
        time.sleep(2)
        answers = []
        for _ in range(10):
            started = time.perf_counter()
            try:
                outcome = str(httpx.get(base + "/healthz", timeout=5).status_code)
            except httpx.TransportError as exc:
                outcome = type(exc).__name__
            answers.append(f"{outcome} in {(time.perf_counter() - started) * 1e3:.1f} ms")
        print("/healthz while held:", ", ".join(answers))
        for elapsed in (0, 5, 10, 15):
            print(f"sockets the server holds {elapsed} s later: {_sockets_of(server.pid)}")
            time.sleep(5)
    finally:
        server.kill()
        server.wait()
        for sock in held:
            sock.close()


if __name__ == "__main__":
    main()
