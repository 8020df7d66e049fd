"""``tuner serve``: the recommendation service under uvicorn, in one or more processes."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from typing import TYPE_CHECKING, Any

from rich.console import Console

from tuner.core.commands import EXIT_FAILED, EXIT_OK, positive_int

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
    serve.add_argument(
        "--forwarded-allow-ips",
        default=None,
        metavar="ADDRESSES",
        help="behind a reverse proxy: its addresses (comma-separated, '*' for any), whose "
        "X-Forwarded-For/-Proto headers are trusted (default: TUNER_FORWARDED_ALLOW_IPS, "
        "else none)",
    )
    serve.add_argument(
        "--no-access-log",
        dest="access_log",
        action="store_false",
        default=None,
        help="write no line per request on stderr (default: on; TUNER_ACCESS_LOG=false)",
    )


def serving_app() -> FastAPI:
    """The app of one server process, built from the TUNER_ environment that :func:`run`
    set, after it prepared the database."""
    from api.main import create_app

    app = create_app(prepare=False)
    if app.state.settings.access_log:
        _log_requests_to_stderr()
    # A full garbage collection walks every tracked object, and most of them are the
    # imported libraries, alive as long as the process: 50-70 ms pauses that set the p99
    # under load. Frozen after start-up, collections walk only what requests leave behind.
    gc.collect()
    gc.freeze()
    return app


def _log_requests_to_stderr() -> None:
    """The access log's lines on stderr, as they are: whatever runs the service (systemd's
    journal, Docker, a terminal) stamps the time, so the line does not pay for it."""
    from api.access_log import LINES

    LINES.start(sys.stderr.fileno())


def run(args: argparse.Namespace, stderr: Console) -> int:
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from api.config import ServiceSettings
    from api.connections import ConnectionLimits, ServingConfig, effective_max_connections
    from api.migrate import prepare_database

    overrides = {
        name: value
        for name, value in (
            ("host", args.host),
            ("port", args.port),
            ("database_url", args.database_url),
            ("public_reads", args.public_reads),
            ("workers", args.workers),
            ("write_rate_limit", args.write_rate_limit),
            ("access_log", args.access_log),
            ("forwarded_allow_ips", args.forwarded_allow_ips),
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
    limits = ConnectionLimits(
        request_timeout_s=settings.request_timeout_s,
        write_timeout_s=settings.write_timeout_s,
        max_connections=effective_max_connections(settings.max_connections),
        max_pipelined_requests=settings.max_pipelined_requests,
        max_target_bytes=settings.max_target_bytes,
        max_header_bytes=settings.max_header_bytes,
    )
    config = ServingConfig(
        "api.cli.serve:serving_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level="warning",
        access_log=False,  # ours (api.access_log) names the token and leaves out values
        timeout_keep_alive=settings.keep_alive_timeout_s,  # a float is fine: call_later's delay
        # uvicorn trusts X-Forwarded-* from 127.0.0.1 unless told otherwise: with nothing in
        # front, any local process could claim HTTPS. Trusted only from the proxy named.
        proxy_headers=settings.forwarded_allow_ips is not None,
        forwarded_allow_ips=settings.forwarded_allow_ips,
        limits=limits,
    )
    # What uvicorn.run does with an app given by name, with our configuration.
    server = uvicorn.Server(config)
    if config.workers > 1:
        Multiprocess(config, sockets=[config.bind_socket()]).run()
    else:
        server.run()
        if not server.started:
            return EXIT_FAILED
    return EXIT_OK
