"""The ``tuner`` command: one subcommand per module in ``tuner.cli.commands``.

Exit statuses: 0 done, 1 failed (the workload raised, the service refused), 2 bad input,
3 nothing fits.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import import_module
from typing import NoReturn

from rich.console import Console

from tuner.cli.commands._args import EXIT_BAD_INPUT, EXIT_FAILED
from tuner.core.errors import BadInputError, TunerError
from tuner.core.extras import MissingExtraError, require

COMMANDS = ("profile", "db", "token", "serve", "worker", "recommend")
# The extra each command cannot start without: checked before it runs, so a missing one is
# one line naming the install (exit 2), not an import traceback. `tuner recommend` and
# `tuner worker` need none to start (a database URL makes the client ask for `server`).
COMMAND_EXTRAS = {"profile": "torch", "db": "server", "token": "server", "serve": "server"}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line that says what to do, instead of argparse's usage dump.
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tuner", description="Find the largest micro batch that fits, and use it."
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMANDS:
        import_module(f"tuner.cli.commands.{name}").add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stderr = Console(stderr=True)
    command = import_module(f"tuner.cli.commands.{args.command}")
    # Errors print with soft_wrap: one line, also on a pipe that rich would wrap at 80 columns.
    try:
        if args.command in COMMAND_EXTRAS:
            require(COMMAND_EXTRAS[args.command], feature=f"tuner {args.command}")
        status: int = command.run(args, stderr)
    except MissingExtraError as exc:  # its message names what needs the extra
        stderr.print(exc.message, highlight=False, markup=False, soft_wrap=True)
        return EXIT_BAD_INPUT
    except BadInputError as exc:
        stderr.print(
            f"tuner {args.command}: {exc.message}", highlight=False, markup=False, soft_wrap=True
        )
        return EXIT_BAD_INPUT
    except TunerError as exc:
        stderr.print(
            f"tuner {args.command}: {exc.message}", highlight=False, markup=False, soft_wrap=True
        )
        return EXIT_FAILED
    return status


if __name__ == "__main__":
    sys.exit(main())
