"""What one client may send, so that it cannot crowd out the others: request bodies up to a
size (:class:`BodySizeLimit`, a pure ASGI guard answering 413) and writes up to a rate per
token (:class:`WriteLimiter`, answering 429 with how long to wait).

The write counting is the ``limits`` library's moving window, kept in the process's
memory: one entry per token that wrote recently, so it stays small however many requests
come. Each service process counts on its own, so with ``--workers N`` a token may reach N
times the rate; reads are never limited (they are cached and cheap).
"""

from __future__ import annotations

import json
import math
import time

from limits import RateLimitItem, parse, storage, strategies
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.security import Principal
from tuner.core.errors import BadInputError, RateLimitedError


class BodyTooLargeError(Exception):
    pass


class BodySizeLimit:
    """Refuses bodies larger than ``max_bytes``: at once when Content-Length says so, and
    while reading when the body is streamed without one."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._refuse(send)
            return
        if b"transfer-encoding" not in headers:
            # No body, or one framed by its Content-Length (checked above), which the
            # server reads to the byte: nothing to count, so nothing to wrap.
            await self.app(scope, receive, send)
            return
        received = 0
        overflowed = refused = started = False

        async def counting_receive() -> Message:
            nonlocal received, overflowed
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    overflowed = True
                    raise BodyTooLargeError
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal refused, started
            if overflowed and not started:
                # The app saw its read fail and may answer in its own words (FastAPI:
                # 400 "error parsing the body"); the client hears what really happened.
                if not refused:
                    refused = True
                    await self._refuse(send)
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except BodyTooLargeError:
            if not (refused or started):
                refused = True
                await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(
            {
                "error": {
                    "code": "payload_too_large",
                    "message": f"request body is over {self.max_bytes} bytes; send less",
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


DEFAULT_WRITE_RATE = "600/minute"


def parse_rate(text: str | None) -> RateLimitItem | None:
    """``"600/minute"`` (``limits``' notation), or ``None``/``"none"`` for no limit."""
    if text is None or text.strip().lower() in ("", "none", "off"):
        return None
    try:
        return parse(text)
    except ValueError:
        raise BadInputError(
            f"write rate limit {text!r} is not a rate: give e.g. '600/minute', "
            "'20/second' or 'none'"
        ) from None


class WriteLimiter:
    """Counts each token's writes; refuses one over the rate with how long to wait."""

    def __init__(self, rate: str | None) -> None:
        self.rate = rate
        self.item = parse_rate(rate)
        self._window = strategies.MovingWindowRateLimiter(storage.MemoryStorage())

    def check(self, principal: Principal) -> None:
        if self.item is None or principal.token_id is None:
            return
        key = str(principal.token_id)
        if self._window.hit(self.item, "writes", key):
            return
        reset = self._window.get_window_stats(self.item, "writes", key).reset_time
        wait = max(1, math.ceil(reset - time.time()))
        raise RateLimitedError(
            f"token {principal.name!r} has made {self.rate} writes: wait {wait} s, or run "
            "the service with a higher TUNER_WRITE_RATE_LIMIT",
            retry_after_s=wait,
        )
