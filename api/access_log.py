"""One line per request on the server's stderr: method, path, status, duration and
the name of the token that asked.

The query's parameter names are kept and its values dropped (a workload's name may be
confidential, and a value is where a careless client would put a secret); the token
itself is never written, only the name its admin gave it. Control characters and bytes
outside ASCII are escaped, so a request cannot forge a line of its own.

A line looks like::

    GET /api/v1/recommendation?workload&device&global_batch_size 200 0.31ms token=ci
"""

from __future__ import annotations

import asyncio
import atexit
import os
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

TOKEN_NAME = "token_name"  # where authorization leaves the caller's name in scope["state"]
_LONGEST_PART = 200  # characters of a path or of the query's names
FLUSH_AFTER_S = 0.5  # a line waits at most this long before it is written
_MOST_PENDING = 512  # lines kept before a write regardless of the time


class PendingLines:
    """The lines of one server process, written to a file descriptor in one system call
    at most every :data:`FLUSH_AFTER_S` (and at exit).

    Not :mod:`logging`: a record and a write per request cost 11-14 µs on this 2-core
    machine (``LOGGER.info`` through a ``StreamHandler``), about as much as the rest of a
    cached answer. Appending a formatted line to a list costs under one, and one
    ``os.write`` a batch makes the write's cost vanish under load. Lines are added and
    written from the event loop's thread only; nothing is written until :meth:`start`.
    """

    def __init__(self) -> None:
        self.fd: int | None = None
        self._pending: list[str] = []

    def start(self, fd: int) -> None:
        """Write to ``fd`` from now on (the server's stderr), and whatever is left at exit."""
        if self.fd is None:
            atexit.register(self.flush)
        self.fd = fd

    @property
    def enabled(self) -> bool:
        return self.fd is not None

    def add(self, line: str) -> None:
        if not self._pending:  # the first line of a batch sets the time it is written by
            try:
                asyncio.get_running_loop().call_later(FLUSH_AFTER_S, self.flush)
            except RuntimeError:  # no event loop in this thread: write at once
                self._pending.append(line)
                self.flush()
                return
        self._pending.append(line)
        if len(self._pending) >= _MOST_PENDING:
            self.flush()

    def flush(self) -> None:
        if not self._pending or self.fd is None:
            return
        data = "".join(self._pending).encode("ascii", "backslashreplace")
        self._pending.clear()
        while data:  # a pipe may take part of a large write
            data = data[os.write(self.fd, data) :]


LINES = PendingLines()


def log_request(
    method: str, target: str, status: int, seconds: float, token_name: str | None
) -> None:
    if LINES.enabled:
        # A token's name is checked when the token is made (tuner token create), but one
        # stored before that was may hold a newline: escaped, it cannot start a line.
        name = _printable_text(token_name) if token_name else "-"
        LINES.add(f"{method} {target} {status} {seconds * 1e3:.2f}ms token={name}\n")


def logged_target(path: bytes, query_string: bytes) -> str:
    """The path as sent, and the names of the query's parameters without their values."""
    target = _printable(path)
    if query_string:
        names = b"&".join(part.partition(b"=")[0] for part in query_string.split(b"&") if part)
        target += "?" + _printable(names)
    return target


def _printable(raw: bytes) -> str:
    text = _printable_text(raw[:_LONGEST_PART].decode("ascii", "backslashreplace"))
    return text + ("..." if len(raw) > _LONGEST_PART else "")


def _printable_text(text: str) -> str:
    if text.isprintable():
        return text  # beyond ASCII, escaped when the lines are written
    return text.encode("unicode_escape").decode("ascii")


class AccessLog:
    """ASGI middleware: writes a request's line when its response has been sent (or its
    handling failed: a 500)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # unless a response starts

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            if LINES.enabled:  # else the line need not even be made
                path = scope.get("raw_path") or scope["path"].encode()
                log_request(
                    scope["method"],
                    logged_target(path, scope["query_string"]),
                    status,
                    time.perf_counter() - started,
                    scope.get("state", {}).get(TOKEN_NAME),
                )
