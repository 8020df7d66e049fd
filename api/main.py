"""The FastAPI application: ``create_app(settings)`` builds one; ``tuner serve`` runs it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api.access_log import AccessLog
from api.cache import GenerationCache, SingleFlight
from api.config import ServiceSettings
from api.dashboard.routes import install as install_dashboard
from api.db import Database
from api.errors import install_error_handlers
from api.limits import BodySizeLimit, WriteLimiter
from api.migrate import prepare_database
from api.openapi_ui import install as install_api_docs
from api.routes import (
    devices,
    health,
    jobs,
    oom_reports,
    profiles,
    recommendation,
    workers,
    workloads,
)
from api.service import answer_slots
from api.store.generation import DirectReader
from tuner.core import __version__
from tuner.core.wire.common import API_PREFIX


def create_app(settings: ServiceSettings | None = None, *, prepare: bool = True) -> FastAPI:
    """The service over ``settings`` (default: the TUNER_ environment). ``prepare=False``
    when the caller has run :func:`prepare_database` already, as ``tuner serve`` does
    once before it starts its processes."""
    settings = settings or ServiceSettings()
    if prepare:
        prepare_database(settings)
    database = Database(settings.database_url)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        app.state.reader.close()
        database.dispose()

    app = FastAPI(
        title="microbatch-tuner",
        version=__version__,
        summary="Measured micro batch sizes and gradient-accumulation steps for PyTorch training",
        lifespan=lifespan,
        # FastAPI's pages load Swagger UI and ReDoc from a CDN; ours ship with the package.
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.db = database
    # Token checks kept per store generation (see api.cache).
    app.state.reader = DirectReader(database.engine)
    app.state.principals = GenerationCache()
    app.state.project_ids = {}
    app.state.project_names = {}
    app.state.write_limiter = WriteLimiter(settings.write_rate_limit)
    app.state.principal_checks = SingleFlight()
    app.state.answer_slots = answer_slots(settings.answer_threads)
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    if settings.access_log:
        app.add_middleware(AccessLog)  # outermost: it times and sees every answer
    app.include_router(recommendation.router, prefix=API_PREFIX)
    app.include_router(health.router)
    app.include_router(jobs.router, prefix=API_PREFIX)
    app.include_router(workers.router, prefix=API_PREFIX)
    for resource in (devices, workloads, profiles, oom_reports):
        app.include_router(resource.router, prefix=API_PREFIX)
    install_api_docs(app)  # /docs and /redoc, offline; before the dashboard's catch-all
    install_dashboard(app)
    return app
