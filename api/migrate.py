"""Schema migrations (Alembic), configured from code so no alembic.ini is needed."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from api.config import ServiceSettings
from api.db import create_db_engine
from tuner.core.errors import BadInputError

# Installed, api/migrations is a package inside the wheel; in a checkout it is a link to
# the top-level migrations/ folder.
MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["url"] = url
    return config


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def current_revision(url: str) -> str | None:
    engine = create_db_engine(url)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()


def prepare_database(settings: ServiceSettings) -> None:
    """SQLite is created and migrated on first start; PostgreSQL must be at the head
    revision already (`tuner db upgrade`), since a fleet's schema changes deliberately."""
    if settings.database_url.startswith("sqlite"):
        upgrade(settings.database_url)
        return
    current, head = current_revision(settings.database_url), head_revision()
    if current != head:
        raise BadInputError(
            f"the database is at schema revision {current or '(empty)'} but this service "
            f"needs {head}: run `tuner db upgrade` with the same TUNER_DATABASE_URL"
        )
