"""``tuner token create | list | revoke``: API tokens, managed on the store directly.

There is no default token or password: the first token is made here, by whoever can
reach the database.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table

from tuner.core.commands import EXIT_OK, positive_int
from tuner.core.errors import BadInputError
from tuner.core.names import name_problem

DEFAULT_PROJECT = "default"  # api.models.DEFAULT_PROJECT, without importing the store here


def add_parser(commands: Any) -> None:
    token = commands.add_parser("token", help="create, list and revoke API tokens")
    token.add_argument(
        "--database-url", default=None, help="default: TUNER_DATABASE_URL, else the SQLite file"
    )
    actions = token.add_subparsers(dest="token_action", required=True)
    create = actions.add_parser("create", help="create a token and print it (shown only once)")
    create.add_argument("--name", required=True, help="who or what uses it, e.g. gpu-worker-3")
    create.add_argument(
        "--scope",
        dest="scopes",
        action="append",
        choices=("read", "write", "worker", "admin"),
        required=True,
        help="read, write, worker or admin; repeat for several",
    )
    where = create.add_mutually_exclusive_group()
    where.add_argument(
        "--project",
        default=DEFAULT_PROJECT,
        help="the project it reads and writes, created if new (default: default); a "
        "token sees nothing of other projects",
    )
    where.add_argument(
        "--all-projects",
        action="store_true",
        help="admin tokens only: every project (a request names one with X-Tuner-Project)",
    )
    actions.add_parser("list", help="list tokens (never their secret)")
    revoke = actions.add_parser("revoke", help="revoke a token by id")
    revoke.add_argument("token_id", type=positive_int)


def run(args: argparse.Namespace, stderr: Console) -> int:
    from api import migrate
    from api.config import ServiceSettings
    from api.db import Database
    from api.store.projects import project_names
    from api.store.tokens import create_token, list_tokens, revoke_token

    if args.token_action == "create":
        # The name is written in the access log and shown in lists: one visible string.
        problem = name_problem(args.name)
        if problem is not None:
            raise BadInputError(f"--name {args.name!r} {problem}")
    url = args.database_url or ServiceSettings().database_url
    if url.startswith("sqlite"):
        migrate.upgrade(url)  # the first command on a new machine may well be this one
    database = Database(url)
    try:
        if args.token_action == "create":
            with database.session(write=True) as session:
                project = None if args.all_projects else args.project
                row, plain = create_token(
                    session, name=args.name, scopes=args.scopes, project=project
                )
                token_id = row.id
            print(plain)
            scopes = ", ".join(sorted(set(args.scopes)))
            where = "every project" if project is None else f"project {project}"
            stderr.print(
                f"token {token_id} ({args.name}, scopes {scopes}, {where}) "
                "created; it is shown only this once",
                highlight=False,
            )
        elif args.token_action == "list":
            with database.session() as session:
                rows = list_tokens(session)
                names = project_names(session)
            table = Table(
                "id", "name", "prefix", "scopes", "project", "created", "last used", "revoked"
            )
            for row in rows:
                table.add_row(
                    str(row.id),
                    row.name,
                    row.prefix + "...",
                    row.scopes,
                    "(all)" if row.project_id is None else names.get(row.project_id, "?"),
                    f"{row.created_at:%Y-%m-%d %H:%M}",
                    f"{row.last_used_at:%Y-%m-%d %H:%M}" if row.last_used_at else "-",
                    f"{row.revoked_at:%Y-%m-%d %H:%M}" if row.revoked_at else "-",
                )
            Console().print(table)
        else:
            with database.session(write=True) as session:
                revoke_token(session, args.token_id)
            stderr.print(f"token {args.token_id} revoked", highlight=False)
    finally:
        database.dispose()
    return EXIT_OK
