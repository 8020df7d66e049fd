"""One module per ``tuner`` subcommand, each with ``add_parser(subparsers)`` and
``run(args, stderr) -> exit status``. Heavy imports (torch, the service) happen in ``run``."""
