"""``tuner serve``: the recommendation service under uvicorn, in one or more processes."""

from __future__ import annotations

import argparse
import gc
import os
from typing import TYPE_CHECKING, Any

from rich.console import Console

from tuner.cli.commands._args import EXIT_OK, positive_int

if TYPE_CHECKING:
    from fastapi import FastAPI


def add_parser(commands: Any) -> None:
    serve = commands.add_parser("serve", help="run the recommendation service and dashboard")
    serve.add_argument("--host", default=None, help="default: TUNER_HOST, else 127.0.0.1")
    serve.add_argument("--port", type=positive_int, default=None, help="default: 8000")
    serve.add_argument(
        "--database-url", default=None, help="default: TUNER_DATABASE_URL, else the SQLite file"
    )
    serve.add_argument(
        "--public-reads", action="store_true", default=None, help="answer GETs without a token"
    )
    serve.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help="server processes, sharing the port (default: TUNER_WORKERS, else 1); cached "
        "answers stay exact across them",
    )
    serve.add_argument(
        "--write-rate-limit",
        default=None,
        help="writes each token may make, per process: '600/minute' (the default, "
        "TUNER_WRITE_RATE_LIMIT), '20/second', or 'none'",
    )


def serving_app() -> FastAPI:
    """The app of one server process, built from the TUNER_ environment that :func:`run`
    set, after it prepared the database."""
    from api.main import create_app

    app = create_app(prepare=False)
    # A full garbage collection walks every tracked object, and most of them are the
    # imported libraries, alive as long as the process: 50-70 ms pauses that set the p99
    # under load. Frozen after start-up, collections walk only what requests leave behind.
    gc.collect()
    gc.freeze()
    return app


def run(args: argparse.Namespace, stderr: Console) -> int:
    import uvicorn

    from api.config import ServiceSettings
    from api.main import prepare_database

    overrides = {
        name: value
        for name, value in (
            ("host", args.host),
            ("port", args.port),
            ("database_url", args.database_url),
            ("public_reads", args.public_reads),
            ("workers", args.workers),
            ("write_rate_limit", args.write_rate_limit),
        )
        if value is not None
    }
    settings = ServiceSettings(**overrides)
    # Each process builds its app from the environment, so the command line goes there.
    for name, value in overrides.items():
        os.environ[f"TUNER_{name.upper()}"] = str(value)
    prepare_database(settings)  # once, before the processes start
    processes = f", {settings.workers} processes" if settings.workers > 1 else ""
    stderr.print(
        f"serving on http://{settings.host}:{settings.port} "
        f"({'public reads' if settings.public_reads else 'reads need a token'}{processes})",
        highlight=False,
    )
    uvicorn.run(
        "tuner.cli.commands.serve:serving_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers if settings.workers > 1 else None,
        log_level="warning",
        access_log=False,
    )
    return EXIT_OK
