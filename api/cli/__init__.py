"""The service's subcommands of ``tuner`` (``serve``, ``token``, ``db``), one module each
with ``add_parser`` and ``run`` (:class:`tuner.core.commands.Command`). The CLI finds them
through the ``tuner.commands`` entry points of ``pyproject.toml``. Each imports only light
modules at the top, so that ``tuner --help`` works without the server extra; the service's
packages are imported in ``run``."""
