"""A pure ASGI guard that answers 413 to request bodies over the configured size."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send


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
