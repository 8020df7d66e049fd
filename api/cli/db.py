"""``tuner db upgrade | downgrade | current``: schema migrations of the profile store."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from tuner.core.commands import EXIT_OK


def add_parser(commands: Any) -> None:
    db = commands.add_parser(
        "db", help="migrate the profile store", description="Schema migrations (Alembic)."
    )
    db.add_argument(
        "--database-url", default=None, help="default: TUNER_DATABASE_URL, else the SQLite file"
    )
    actions = db.add_subparsers(dest="db_action", required=True)
    upgrade = actions.add_parser("upgrade", help="migrate to the newest schema (or --revision)")
    upgrade.add_argument("--revision", default="head")
    downgrade = actions.add_parser("downgrade", help="migrate back to REVISION ('base': empty)")
    downgrade.add_argument("revision")
    actions.add_parser("current", help="print the schema revision the database is at")


def run(args: argparse.Namespace, stderr: Console) -> int:
    from api import migrate
    from api.config import ServiceSettings

    url = args.database_url or ServiceSettings().database_url
    if args.db_action == "upgrade":
        migrate.upgrade(url, args.revision)
        stderr.print(f"database at revision {migrate.current_revision(url)}", highlight=False)
    elif args.db_action == "downgrade":
        migrate.downgrade(url, args.revision)
        stderr.print(f"database at revision {migrate.current_revision(url)}", highlight=False)
    else:
        print(migrate.current_revision(url) or "(empty)")
    return EXIT_OK
