"""One line per request on the ``tuner.access`` logger: method, path, status, duration and
the name of the token that asked.

The query's parameter names are kept and its values dropped (a workload's name may be
confidential, and a value is where a careless client would put a secret); the token
itself is never written, only the name its admin gave it. Control characters and bytes
outside ASCII are escaped, so a request cannot forge a line of its own.

A line looks like::

    GET /api/v1/recommendation?workload&device&global_batch_size 200 0.31ms token=ci
"""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOGGER = logging.getLogger("tuner.access")
TOKEN_NAME = "token_name"  # where authorization leaves the caller's name in scope["state"]
_LONGEST_PART = 200  # characters of a path or of the query's names


def log_request(
    method: str, target: str, status: int, seconds: float, token_name: str | None
) -> None:
    LOGGER.info(
        "%s %s %d %.2fms token=%s", method, target, status, seconds * 1e3, token_name or "-"
    )


def logged_target(path: bytes, query_string: bytes) -> str:
    """The path as sent, and the names of the query's parameters without their values."""
    target = _printable(path)
    if query_string:
        names = b"&".join(part.partition(b"=")[0] for part in query_string.split(b"&") if part)
        target += "?" + _printable(names)
    return target


def _printable(raw: bytes) -> str:
    text = raw[:_LONGEST_PART].decode("ascii", "backslashreplace")
    if not text.isprintable():
        text = text.encode("unicode_escape").decode("ascii")
    return text + ("..." if len(raw) > _LONGEST_PART else "")


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
            if LOGGER.isEnabledFor(logging.INFO):  # else the line need not even be made
                path = scope.get("raw_path") or scope["path"].encode()
                log_request(
                    scope["method"],
                    logged_target(path, scope["query_string"]),
                    status,
                    time.perf_counter() - started,
                    scope.get("state", {}).get(TOKEN_NAME),
                )
