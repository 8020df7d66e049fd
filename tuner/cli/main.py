"""The ``tuner`` command: one subcommand per module in ``tuner.cli.commands``, and those
the service declares (``serve``, ``token``, ``db``: the ``tuner.commands`` entry points),
found without importing the service.

Exit statuses: 0 done, 1 failed (the workload raised, the service refused), 2 bad input
(or the server extra missing for a service command), 3 nothing fits.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import sys
from collections.abc import Sequence
from importlib import import_module
from importlib.metadata import entry_points
from typing import NoReturn, cast

from rich.console import Console

from tuner.core.commands import EXIT_BAD_INPUT, EXIT_FAILED, Command
from tuner.core.errors import BadInputError, TunerError
from tuner.core.extras import MissingExtraError, install_line, require

COMMANDS = ("profile", "worker", "recommend")
# The service's commands: modules of the service (api/), declared in pyproject.toml.
COMMANDS_GROUP = "tuner.commands"
OURS = ("tuner", "api")
# The extra each command cannot start without: checked before it runs, so a missing one is
# one line naming the install (exit 2), not an import traceback. `tuner recommend` and
# `tuner worker` need none to start (a database URL makes the client ask for `server`).
COMMAND_EXTRAS = {"profile": "torch", "db": "server", "token": "server", "serve": "server"}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line that says what to do, instead of argparse's usage dump.
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {message} (see {self.prog} --help)\n")


def commands() -> dict[str, Command]:
    """Every subcommand by name: ours, then the service's."""
    found = {
        name: cast("Command", import_module(f"tuner.cli.commands.{name}")) for name in COMMANDS
    }
    for entry in entry_points(group=COMMANDS_GROUP):
        found.setdefault(entry.name, cast("Command", entry.load()))
    return found


def build_parser(found: dict[str, Command] | None = None) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tuner", description="Find the largest micro batch that fits, and use it."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for command in (found or commands()).values():
        command.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # A process that loaded torch spends over a second at exit in the interpreter's last
    # garbage collection, walking torch's objects (1.6 s measured on a busy 2-core machine;
    # 0.5 s with them frozen first). Nothing the command leaves needs that collection: its
    # files, connections and consoles are closed or flushed where they are used.
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
    found = commands()
    args = build_parser(found).parse_args(argv)
    stderr = Console(stderr=True)
    command = found[args.command]
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
    except ModuleNotFoundError as exc:
        # A service command without the service's packages: say how to install them.
        missing = (exc.name or "").partition(".")[0]
        if args.command in COMMANDS or not missing or missing in OURS:
            raise
        stderr.print(
            f"tuner {args.command}: needs the service's packages ({missing} is missing): "
            f"{install_line('server')}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        return EXIT_BAD_INPUT
    return status


if __name__ == "__main__":
    sys.exit(main())
