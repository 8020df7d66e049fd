"""``tuner serve``: the recommendation service under uvicorn."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from tuner.commands._args import EXIT_OK, positive_int


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


def run(args: argparse.Namespace, stderr: Console) -> int:
    import uvicorn

    from api.config import ServiceSettings
    from api.main import create_app

    overrides = {
        name: value
        for name, value in (
            ("host", args.host),
            ("port", args.port),
            ("database_url", args.database_url),
            ("public_reads", args.public_reads),
        )
        if value is not None
    }
    settings = ServiceSettings(**overrides)
    app = create_app(settings)
    stderr.print(
        f"serving on http://{settings.host}:{settings.port} "
        f"({'public reads' if settings.public_reads else 'reads need a token'})",
        highlight=False,
    )
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning")
    return EXIT_OK
