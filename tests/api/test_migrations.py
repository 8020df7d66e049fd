"""Migrations upgrade and downgrade on SQLite and PostgreSQL, and agree with the models."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from api import migrate
from api.db import create_db_engine
from api.models import Base


def test_upgrade_downgrade_upgrade(database_url: str) -> None:
    migrate.upgrade(database_url)
    assert migrate.current_revision(database_url) == migrate.head_revision()
    engine = create_db_engine(database_url)
    assert set(Base.metadata.tables) <= set(inspect(engine).get_table_names())
    engine.dispose()

    migrate.downgrade(database_url, "base")
    assert migrate.current_revision(database_url) is None
    engine = create_db_engine(database_url)
    assert not set(Base.metadata.tables) & set(inspect(engine).get_table_names())
    engine.dispose()

    migrate.upgrade(database_url)
    assert migrate.current_revision(database_url) == migrate.head_revision()


def test_models_and_migrations_agree(migrated_url: str) -> None:
    engine = create_db_engine(migrated_url)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        differences = compare_metadata(context, Base.metadata)
    engine.dispose()
    assert differences == []
