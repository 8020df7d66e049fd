"""What every ``tuner`` subcommand shares, those of ``tuner.cli.commands`` and those the
service declares (the ``tuner.commands`` entry points): what a command is, the exit
statuses, and the argument types, each of which refuses bad input with one clear line."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, Protocol

from tuner.core.errors import BadInputError
from tuner.core.units import parse_bytes

if TYPE_CHECKING:
    from rich.console import Console

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_NOTHING_FITS = 0, 1, 2, 3


class Command(Protocol):
    """A subcommand: a module with these two functions. Heavy imports (torch, the service's
    packages) happen in ``run``, so that ``tuner --help`` needs none of them."""

    def add_parser(self, commands: Any) -> None:
        """Add the subcommand's parser to ``commands`` (argparse's subparsers)."""

    def run(self, args: argparse.Namespace, stderr: Console) -> int:
        """Do it; the exit status."""


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be a positive whole number")
    return value


def headroom(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"headroom {text!r} is not a number") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(
            f"headroom {value} is outside [0, 1): "
            "give the fraction of memory to keep free, e.g. 0.05"
        )
    return value


def memory(text: str) -> int:
    try:
        return parse_bytes(text)
    except BadInputError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
