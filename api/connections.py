"""Bounds on what a client's connections may hold in a ``tuner serve`` process.

uvicorn closes a keep-alive connection that stays quiet after a response, but has no
timeout for a request that never finishes arriving: a connection that sends a request
line and never ends its headers (or never sends anything) stays open for ever, and a few
thousand of them exhaust the process's file descriptors, after which nothing is accepted,
``/healthz`` included. httptools also buffers a header of any length. Neither is a setting
of uvicorn's, so this subclass of its httptools protocol adds them:

- a request deadline: a connection has ``request_timeout_s`` to send a whole request
  (headers and body), counted from its opening or from the end of its last response;
  past it, the connection is closed;
- a write deadline: a connection whose peer does not take what we write (the transport's
  buffer stays over its high-water mark, or a closing connection keeps unsent bytes)
  for ``write_timeout_s`` is reset, dropping the unsent bytes. uvicorn waits for such a
  peer for ever, and a request that has arrived whole is under no other deadline, so a
  client that pipelines requests for a large document and never reads held a descriptor
  each until the process had none left;
- a connection limit per process: past ``max_connections``, the connection that has been
  stuck longest, waiting for a whole request or for its peer to read, is closed, so that
  new connections (a health check, a training job's question) are still accepted and
  answered;
- a bound on pipelining: a connection may queue ``max_pipelined_requests`` requests
  behind the one being answered. The next one is not read: the last queued answer says
  ``connection: close``, the connection is closed after it, and the requests past it are
  dropped unanswered, which HTTP/1.1 lets a client retry on a new connection (RFC 9112,
  9.3.2). uvicorn queues every request of a read (64 KiB: about 1,600 small requests)
  and reads again after each answer;
- refusals: a request target (path and query string) over ``max_target_bytes`` is answered
  414 and a header section over ``max_header_bytes`` 431, with the service's JSON error
  body; a head that outgrows both without ending is answered 431 at once, so no more than
  their sum and one read is buffered for it.

uvicorn's own ``limit_concurrency`` is not used: it counts open connections, so held
half-open ones would make every request, ``/healthz`` included, a 503.

Connections waiting for a request are kept in arrival order, and every one waits the same
time at most, so the oldest is both the first to expire and the one to close when the
process is full: a sweep every second pops expired ones from the front, in
O(expired) time, and the hot path (a keep-alive connection asking again) costs two dict
operations. Connections waiting for their peer to read are kept the same way, apart.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Literal, overload

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from api.access_log import log_request

# File descriptors kept free beyond the connections: the database, log files, the
# threadpool's and the event loop's own.
RESERVED_DESCRIPTORS = 128


@dataclass(frozen=True)
class ConnectionLimits:
    request_timeout_s: float = 10.0
    write_timeout_s: float = 10.0
    max_connections: int = 2048
    max_pipelined_requests: int = 16
    max_target_bytes: int = 4096
    max_header_bytes: int = 16 * 1024


class ServingConfig(uvicorn.Config):
    """uvicorn's configuration with :class:`ConnectionLimits`, which travel with it to
    every server process."""

    def __init__(self, app: str, *, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(app, http=GuardedHttpProtocol, **kwargs)
        self.limits = limits


class _Queue:
    """Connections stuck in one way, oldest first, each with its deadline: every one gets
    the same time, so arrival order is deadline order."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.deadlines: OrderedDict[GuardedHttpProtocol, float] = OrderedDict()

    def add(self, connection: GuardedHttpProtocol, now: float) -> None:
        self.deadlines[connection] = now + self.timeout_s
        self.deadlines.move_to_end(connection)

    def expired(self, now: float) -> list[GuardedHttpProtocol]:
        gone = []
        while self.deadlines:
            connection, deadline = next(iter(self.deadlines.items()))
            if deadline > now:
                break
            del self.deadlines[connection]
            gone.append(connection)
        return gone

    def oldest(self, spare: GuardedHttpProtocol | None) -> tuple[float, GuardedHttpProtocol] | None:
        """When the longest-stuck connection but ``spare`` got stuck, and that connection."""
        for connection, deadline in self.deadlines.items():
            if connection is not spare:
                return deadline - self.timeout_s, connection
        return None


class _Waiting:
    """The connections of one server process that are stuck: waiting for a whole request
    (``requests``) or for their peer to take what was written (``writes``)."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.requests = _Queue(limits.request_timeout_s)
        self.writes = _Queue(limits.write_timeout_s)
        self.sweeping = False

    def add(self, connection: GuardedHttpProtocol, now: float) -> None:
        self.requests.add(connection, now)
        self._sweep_soon(connection.loop)

    def add_writer(self, connection: GuardedHttpProtocol, now: float) -> None:
        if connection not in self.writes.deadlines:  # the deadline runs from the first stall
            self.writes.add(connection, now)
            self._sweep_soon(connection.loop)

    def forget(self, connection: GuardedHttpProtocol) -> None:
        self.requests.deadlines.pop(connection, None)
        self.writes.deadlines.pop(connection, None)

    def _sweep_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self.sweeping:
            self.sweeping = True
            loop.call_later(self._interval(), self._sweep, loop)

    def _interval(self) -> float:
        shortest = min(self.limits.request_timeout_s, self.limits.write_timeout_s)
        return min(1.0, max(0.05, shortest / 4))

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for connection in self.requests.expired(now) + self.writes.expired(now):
            connection.close_now()
        if self.requests.deadlines or self.writes.deadlines:
            loop.call_later(self._interval(), self._sweep, loop)
        else:
            self.sweeping = False

    def close_oldest(self, spare: GuardedHttpProtocol | None) -> None:
        """Closes the connection that has been stuck longest, unless it is ``spare``."""
        candidates = [
            found
            for found in (self.requests.oldest(spare), self.writes.oldest(spare))
            if found is not None
        ]
        if candidates:
            _, connection = min(candidates, key=lambda found: found[0])
            self.forget(connection)
            connection.close_now()


_waiting_by_server: weakref.WeakKeyDictionary[ServerState, _Waiting] = weakref.WeakKeyDictionary()


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with request and write deadlines, a connection limit,
    bounded pipelining and bounded request heads (see the module's docstring)."""

    def __init__(self, config: uvicorn.Config, server_state: ServerState, **kwargs: Any) -> None:
        super().__init__(config, server_state, **kwargs)
        limits: ConnectionLimits = getattr(config, "limits", ConnectionLimits())
        self.limits = limits
        waiting = _waiting_by_server.get(server_state)
        if waiting is None:
            waiting = _waiting_by_server[server_state] = _Waiting(limits)
        self.waiting = waiting
        # Bytes of the request head being read (-1: none is), bounded before httptools
        # buffers them.
        self.head_bytes = 0
        # Past max_pipelined_requests: what this connection sends is no longer read.
        self.dropping = False
        self.answering: RequestResponseCycle | None = None  # the request being answered

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.waiting.add(self, self.loop.time())
        self._keep_room(spare=self)

    def _keep_room(self, spare: GuardedHttpProtocol | None) -> None:
        # Checked when a connection opens and when one gets stuck writing: a burst of
        # connections may all be busy (not closable) when each opens.
        if len(self.connections) > self.limits.max_connections:
            self.waiting.close_oldest(spare=spare)

    def connection_lost(self, exc: Exception | None) -> None:
        self.waiting.forget(self)
        self._disconnect_answers()
        super().connection_lost(exc)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        self.answering = cycle
        super()._start_asgi_task(cycle, app)

    def _disconnect_answers(self) -> None:
        """Tells the answer being written that its peer is gone. uvicorn tells only the
        newest request's cycle, which under pipelining is a queued one: the answer being
        written, woken when writing resumes, would write to the closed transport, which
        uvloop refuses with a RuntimeError."""
        for cycle in (self.answering, self.cycle):
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True

    def close_now(self) -> None:
        """Closes the connection; resets it if its peer has not taken everything written
        (asyncio's ``close`` would wait for that, with the descriptor held, for ever)."""
        if self.transport.get_write_buffer_size() == 0 and not self.transport.is_closing():
            self.transport.close()
            return
        self._disconnect_answers()
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            # Linger 0: the kernel drops the unsent bytes too, and the peer gets a reset.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def pause_writing(self) -> None:
        super().pause_writing()
        self.waiting.add_writer(self, self.loop.time())
        self._keep_room(spare=None)

    def resume_writing(self) -> None:
        super().resume_writing()
        if not (self.transport.is_closing() and self.transport.get_write_buffer_size()):
            # Taken (or nearly): no longer stuck. A closing connection stays under its
            # deadline until every byte is taken, since its descriptor waits for that.
            self.waiting.writes.deadlines.pop(self, None)

    def data_received(self, data: bytes) -> None:
        if self.dropping:
            return  # over the pipelining bound: closed after the last queued answer
        super().data_received(data)
        if self.head_bytes >= 0 and not self.transport.is_closing():
            # Still reading a head, which httptools holds whole: at most one read past it.
            self.head_bytes += len(data)
            if self.head_bytes > self.limits.max_target_bytes + self.limits.max_header_bytes:
                self._refuse_now(*self._refusal(ended=False))

    @overload
    def _refusal(self, *, ended: Literal[False]) -> tuple[int, str, str]: ...
    @overload
    def _refusal(self, *, ended: bool) -> tuple[int, str, str] | None: ...
    def _refusal(self, *, ended: bool) -> tuple[int, str, str] | None:
        """The refusal a request head earns, if any (``ended``: its headers are all in)."""
        limits = self.limits
        if len(getattr(self, "url", b"")) > limits.max_target_bytes:
            return (
                414,
                "uri_too_long",
                f"the request's path and query string are over {limits.max_target_bytes} "
                "bytes: ask with fewer or shorter parameters",
            )
        if not ended or sum(len(k) + len(v) + 4 for k, v in self.headers) > (
            limits.max_header_bytes
        ):
            return (
                431,
                "headers_too_large",
                f"the request's headers are over {limits.max_header_bytes} bytes: send "
                "fewer or shorter headers",
            )
        return None

    def on_headers_complete(self) -> None:
        if self.dropping:
            return
        self.head_bytes = -1  # the body's size is the app's to bound (BodySizeLimit)
        if self.pipeline and len(self.pipeline) >= self.limits.max_pipelined_requests:
            # One more than the bound: answer those queued, then hang up (the newest
            # queued is at the left); this request and any after it are never started.
            self.dropping = True
            self.pipeline[0][0].keep_alive = False
            return
        refusal = self._refusal(ended=True)
        if refusal is None:
            super().on_headers_complete()
            return
        # uvicorn runs ``self.app`` for the request: the refusal is answered in its place.
        app, self.app = self.app, _refusal_app(*refusal)
        try:
            super().on_headers_complete()
        finally:
            self.app = app

    def on_body(self, body: bytes) -> None:
        if not self.dropping:  # else the body is a dropped request's, not the queued one's
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self.dropping:
            return
        if self.cycle is not None and self.cycle.response_complete:
            # Answered before its body was in (a refusal): now waiting for the next request.
            self.waiting.add(self, self.loop.time())
        else:
            self.waiting.requests.deadlines.pop(self, None)  # the whole request is in
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            if self.transport.get_write_buffer_size():
                # Closed with bytes its peer has not taken: asyncio holds the descriptor
                # until it does, so the write deadline applies.
                self.waiting.add_writer(self, self.loop.time())
            return
        if self.dropping:
            self.flow.pause_reading()  # what comes next would be dropped: leave it unread
            return
        self.head_bytes = 0
        if not self.pipeline and self.cycle.response_complete:
            self.waiting.add(self, self.loop.time())  # now waiting for the next request

    def _refuse_now(self, status: int, code: str, message: str) -> None:
        """Answers a head that grows past every limit without ending, and hangs up."""
        body = _error_body(code, message)
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
            "content-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        self.transport.close()
        log_request("-", "(unread)", status, 0.0, None)


def _error_body(code: str, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}).encode()


def _refusal_app(status: int, code: str, message: str) -> Any:
    body = _error_body(code, message)

    async def refuse(scope: Any, receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", b"%d" % len(body)),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
        log_request(scope["method"], "(refused)", status, 0.0, None)

    return refuse


def effective_max_connections(wanted: int) -> int:
    """``wanted``, or fewer where the open-file limit (raised to its hard limit first)
    would not leave room for them beside the process's own descriptors."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass  # some systems cap it lower than the hard limit says; keep what we have
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - RESERVED_DESCRIPTORS))
