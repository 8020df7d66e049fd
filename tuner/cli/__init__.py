"""The ``tuner`` command (``main``), its subcommands (``commands``) and the live display."""

from tuner.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
