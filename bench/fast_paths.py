"""What each of the recommendation's fast paths is worth, measured side by side in one run.

The service answers ``GET /api/v1/recommendation`` through four things written for speed.
Each is switched off in turn and the same requests are timed through the whole ASGI app,
in process (no sockets, no other process: the figures are the service's own work):

- ``CachedAnswers``: the middleware that answers before FastAPI's routing; off, the route
  answers every request.
- prepared reads (``api/store/prepared.py``): statements compiled once and run on the
  driver's cursor; off, each read is executed by SQLAlchemy (Core, a cached statement).
- the query read by ``api/query_model.py``; off, FastAPI reads a ``Query()`` model (the
  route then takes the query as a parameter, as FastAPI would have it).
- the answer kept as JSON bytes (``Answer``); off, the cached answer is a
  ``RecommendationPublic`` serialized for every request.

Cold: every request a workload and device pair not asked before (caches emptied before the
run). Cached: 200 questions asked over and over. Store: ``bench/service.py``'s, 100,000
profiles in SQLite (``--quick``: 10,000). Each figure is the median of five rounds.

Run: ``python bench/fast_paths.py`` (writes its section of BENCHMARKS.md) or ``--quick``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import Query, Request, Response

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# At module level: FastAPI resolves a route's (string) annotations in its module's globals.
from api.schemas.recommendation import RecommendationQuery  # noqa: E402

Switch = Callable[[], Any]  # a context manager that turns one fast path off


@contextmanager
def no_middleware(app: Any) -> Iterator[None]:
    from api.routes.recommendation import CachedAnswers

    kept = app.user_middleware
    app.user_middleware = [m for m in kept if m.cls is not CachedAnswers]
    app.middleware_stack = None  # rebuilt on the next call
    try:
        yield
    finally:
        app.user_middleware = kept
        app.middleware_stack = None


@contextmanager
def no_prepared_reads(url: str) -> Iterator[None]:
    """Each prepared read executed by SQLAlchemy on its own connection to the same file."""
    from sqlalchemy import create_engine

    from api.store import prepared

    engine = create_engine(url)
    connection = engine.connect()
    original_init, original_rows = prepared.PreparedSelect.__init__, prepared.PreparedSelect.rows

    def init(self: Any, statement: Any, dialect: Any) -> None:
        original_init(self, statement, dialect)
        self._statement = statement

    def rows(self: Any, _connection: Any, **parameters: Any) -> list[Any]:
        return [tuple(row) for row in connection.execute(self._statement, parameters)]

    prepared.PreparedSelect.__init__ = init  # type: ignore[method-assign]
    prepared.PreparedSelect.rows = rows  # type: ignore[method-assign,assignment]
    from api.store import recommendation

    recommendation._prepared.clear()
    try:
        yield
    finally:
        prepared.PreparedSelect.__init__ = original_init  # type: ignore[method-assign]
        prepared.PreparedSelect.rows = original_rows  # type: ignore[method-assign]
        recommendation._prepared.clear()
        connection.close()
        engine.dispose()


@contextmanager
def fastapi_query_model(app: Any) -> Iterator[None]:
    """The route reads its query as FastAPI does (a ``Query()`` model), the middleware off
    (it would answer first)."""
    from api.answers.cached import cached_or_computed
    from api.deps import authorize, current_generation
    from tuner.core.wire.common import API_PREFIX

    async def by_fastapi(
        request: Request, query: Annotated[RecommendationQuery, Query()]
    ) -> Response:
        await authorize(request, "read")
        answer = await cached_or_computed(request.app.state, query, current_generation(request))
        return Response(answer.body(), media_type="application/json")

    path = f"{API_PREFIX}/recommendation"
    routes = app.router.routes
    kept = list(routes)
    routes[:] = [r for r in routes if getattr(r, "path", None) != path]
    app.add_api_route(path, by_fastapi, methods=["GET"])
    routes.insert(0, routes.pop())
    with no_middleware(app):
        try:
            yield
        finally:
            routes[:] = kept


@contextmanager
def serialized_answers() -> Iterator[None]:
    """The answer kept as the model and serialized for every request."""
    from api.answers import cached

    original_of, original_body = cached.Answer.of, cached.Answer.body

    def of(_cls: Any, public: Any) -> Any:
        answer = original_of(public)
        return cached.Answer(public, answer.measured_at)

    def body(self: Any) -> bytes:
        public = self.head
        age = max(0.0, time.time() - self.measured_at)
        return bytes(public.model_copy(update={"profile_age_s": age}).model_dump_json(), "utf-8")

    cached.Answer.of = classmethod(of)  # type: ignore[method-assign,assignment]
    cached.Answer.body = body  # type: ignore[method-assign]
    try:
        yield
    finally:
        cached.Answer.of = original_of  # type: ignore[method-assign]
        cached.Answer.body = original_body  # type: ignore[method-assign]


async def call(app: Any, path: str, token: str) -> bytes:
    target, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": target,
        "raw_path": target.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"bench"), (b"authorization", f"Bearer {token}".encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "app": app,
    }
    body: list[bytes] = []
    status: list[int] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])
        elif message["type"] == "http.response.body":
            body.append(message.get("body", b""))

    await app(scope, receive, send)
    if status != [200]:
        raise RuntimeError(f"{path}: {status} {b''.join(body)[:200]!r}")
    return b"".join(body)


def per_request_us(app: Any, paths: list[str], token: str, *, cold: bool) -> float:
    async def run() -> float:
        if cold:
            app.state.recommendations.clear()
        started = time.perf_counter()
        for path in paths:
            await call(app, path, token)
        return (time.perf_counter() - started) / len(paths) * 1e6

    return asyncio.run(run())


def variants_of(app: Any, url: str) -> list[tuple[str, Switch]]:
    """The app as served, then with each fast path off in turn."""
    return [
        ("all on (as served)", ExitStack),
        ("`CachedAnswers` middleware off", lambda: no_middleware(app)),
        ("prepared reads off (SQLAlchemy Core)", lambda: no_prepared_reads(url)),
        ("query read by FastAPI (middleware off)", lambda: fastapi_query_model(app)),
        ("answers serialized per request", serialized_answers),
    ]


AGE = b',"profile_age_s":'


def answers_under_each(app: Any, url: str, paths: list[str], token: str) -> dict[str, list[bytes]]:
    """Each variant's cold answers to ``paths``, without the age (the one field that moves
    with the clock): a fast path is kept only if these are the same bytes."""

    async def ask() -> list[bytes]:
        app.state.recommendations.clear()
        return [(await call(app, path, token)).rpartition(AGE)[0] for path in paths]

    said = {}
    for name, switch in variants_of(app, url):
        with switch():
            said[name] = asyncio.run(ask())
    return said


def check_agreement(said: dict[str, list[bytes]]) -> None:
    """Before anything is timed: each fast path off answers the bytes served (but for the
    age), measured answers and estimated ones alike; else the run stops, saying which."""
    served = said["all on (as served)"]
    for basis in ("measured", "estimated"):
        if not any(f'"basis":"{basis}"'.encode() in answer for answer in served):
            raise SystemExit(f"no {basis} answer among the questions checked: ask more of them")
    differ = [name for name, answers in said.items() if answers != served]
    if differ:
        raise SystemExit(f"{', '.join(differ)} answered differently: fix it before timing it")


def main(argv: list[str] | None = None) -> int:
    from api.config import ServiceSettings
    from api.main import create_app
    from bench.common import machine_line, markdown_table, write_section
    from bench.service import fill_store

    parser = argparse.ArgumentParser(description="the recommendation's fast paths, each off")
    parser.add_argument("--quick", action="store_true", help="small smoke run; writes nothing")
    args = parser.parse_args(argv)
    workloads = 200 if args.quick else 2000
    workdir = Path(tempfile.mkdtemp(prefix="tuner-fast-"))
    url = f"sqlite:///{workdir / 'tuner.db'}"
    token, paths = fill_store(url, workloads=workloads, devices=10, history=5)
    app = create_app(ServiceSettings(database_url=url, access_log=False))
    cold_paths = paths[: 500 if args.quick else 3000]
    fleet = paths[:200] * (5 if args.quick else 25)

    variants = variants_of(app, url)
    check_agreement(answers_under_each(app, url, paths[:300], token))
    # Warm every path once (imports, statement caches, the middleware stack).
    for _, switch in variants:
        with switch():
            per_request_us(app, paths[-50:], token, cold=True)
    measured: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n, _ in variants}
    for _ in range(5):  # rounds interleaved, so drift touches every variant alike
        for name, switch in variants:
            with switch():
                measured[name][0].append(per_request_us(app, cold_paths, token, cold=True))
                per_request_us(app, fleet[:200], token, cold=True)  # fill the cache
                measured[name][1].append(per_request_us(app, fleet, token, cold=False))
    base_cold, base_cached = (statistics.median(m) for m in measured[variants[0][0]])
    rows = []
    for name, (cold, cached) in measured.items():
        c, k = statistics.median(cold), statistics.median(cached)
        rows.append(
            [name, f"{c:.0f}", f"{c / base_cold:.2f}", f"{k:.1f}", f"{k / base_cached:.2f}"]
        )
        print(f"{name}: cold {c:.0f} µs, cached {k:.1f} µs", flush=True)
    body = "\n\n".join(
        [
            "## What each fast path of the recommendation is worth (`bench/fast_paths.py`)",
            f"Machine: {machine_line()}. {workloads * 50:,} stored profiles (SQLite); the "
            "whole ASGI app called in process, one request at a time, access log off; "
            f"{len(cold_paths):,} cold questions and {len(fleet):,} cached ones a round, "
            "the median of five interleaved rounds. Every variant gave the same bytes (but "
            "for the age) to the first 300 questions before it was timed.",
            markdown_table(["variant", "cold µs", "× as served", "cached µs", "× as served"], rows),
        ]
    )
    if not args.quick:
        write_section("fast-paths", body)
    print(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
