"""``tuner serve | token | db``: the service's commands (``api.cli``), which the CLI finds
through the ``tuner.commands`` entry points, and which say in one line how to install the
server extra when its packages are missing."""

from __future__ import annotations

import pytest

from tests.helpers import run_python
from tuner.cli.main import build_parser, commands

SERVICE_COMMANDS = {"serve": [], "token": ["list"], "db": ["current"]}


def test_the_service_commands_are_found_by_their_entry_points() -> None:
    found = commands()
    assert {name: found[name].__name__ for name in SERVICE_COMMANDS} == {
        "serve": "api.cli.serve",
        "token": "api.cli.token",
        "db": "api.cli.db",
    }
    assert list(found)[:3] == ["profile", "worker", "recommend"]
    usage = build_parser().format_usage()
    assert all(name in usage for name in found)


@pytest.mark.parametrize("command", list(SERVICE_COMMANDS))
def test_without_the_server_extra_a_service_command_says_how_to_install_it(
    command: str,
) -> None:
    # Blocking the imports is exactly what an install without the extra looks like.
    child = run_python(
        "import sys\n"
        "for name in ('fastapi', 'uvicorn', 'sqlalchemy', 'alembic'):\n"
        "    sys.modules[name] = None\n"
        "from tuner.cli import main\n"
        f"sys.exit(main({[command, *SERVICE_COMMANDS[command]]!r}))\n"
    )
    assert child.returncode == 2, child.stderr
    lines = child.stderr.strip().splitlines()
    assert len(lines) == 1, child.stderr
    assert lines[0].startswith(f"tuner {command} needs the server extra (")
    assert "pip install -e '.[server]'" in lines[0]


def test_a_missing_module_of_ours_is_not_taken_for_the_server_extra() -> None:
    child = run_python(
        "import sys\n"
        "sys.modules['api.migrate'] = None\n"
        "from tuner.cli import main\n"
        "main(['db', 'current'])\n"
    )
    assert child.returncode == 1
    assert "ModuleNotFoundError" in child.stderr
    assert "pip install" not in child.stderr
