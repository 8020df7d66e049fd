"""One module per ``tuner`` subcommand of the client side, each with ``add_parser(subparsers)``
and ``run(args, stderr) -> exit status``. Heavy imports (torch) happen in ``run``. The
service's subcommands are in ``api.cli``."""
