"""Fixtures for the store and the service: every test gets a fresh database, on a real
SQLite file and on a real PostgreSQL server (``database_url`` is parametrized over both)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from api import migrate
from api.config import ServiceSettings
from api.db import Database
from api.main import create_app
from api.store.tokens import create_token
from tests.api.worker_processes import Workers
from tests.services import ServerThread, throwaway_postgres


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    with throwaway_postgres() as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'tuner.db'}"


@contextmanager
def fresh_postgres_database(server_url: str) -> Iterator[str]:
    """A new, empty database on the PostgreSQL server at ``server_url``, dropped afterwards."""
    admin = create_engine(
        make_url(server_url).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT"
    )
    name = f"tuner_{uuid.uuid4().hex[:12]}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A new, empty database on the session's PostgreSQL server, dropped afterwards."""
    with fresh_postgres_database(postgres_server) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest) -> str:
    """A fresh, empty database of each kind."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


@pytest.fixture
def migrated_url(database_url: str) -> str:
    migrate.upgrade(database_url)
    return database_url


@pytest.fixture
def database(migrated_url: str) -> Iterator[Database]:
    db = Database(migrated_url)
    yield db
    db.dispose()


def make_token(db: Database, *scopes: str, name: str = "test") -> str:
    with db.session(write=True) as session:
        _, plain = create_token(session, name=name, scopes=list(scopes))
    return plain


@contextmanager
def service_over_sqlite(directory: Path) -> Iterator[tuple[ServerThread, str]]:
    """A service over a new SQLite file in ``directory``, and an admin token for it: for
    module fixtures that measure once and ask many questions."""
    url = f"sqlite:///{directory / 'tuner.db'}"
    migrate.upgrade(url)
    database = Database(url)
    token = make_token(database, "admin", name="admin")
    database.dispose()
    with ServerThread(create_app(ServiceSettings(database_url=url))) as server:
        yield server, token


@pytest.fixture
def service(migrated_url: str) -> Iterator[ServerThread]:
    """The real service under uvicorn on a loopback port, over a fresh database."""
    app = create_app(ServiceSettings(database_url=migrated_url))
    with ServerThread(app) as server:
        yield server


@pytest.fixture
def admin_token(database: Database) -> str:
    return make_token(database, "admin", name="admin")


@pytest.fixture
def http(service: ServerThread, admin_token: str) -> Iterator[httpx.Client]:
    """An HTTP client for the running service, authenticated as admin."""
    with httpx.Client(
        base_url=service.url, headers={"Authorization": f"Bearer {admin_token}"}, timeout=30
    ) as client:
        yield client


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    """``tuner worker`` processes a test starts, all killed when it ends."""
    started = Workers(tmp_path)
    try:
        yield started
    finally:
        started.close()
