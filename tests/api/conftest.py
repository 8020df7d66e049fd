"""Fixtures for the store and the service: every test gets a fresh database, a copy of one
migrated once per session (a SQLite file copied, a PostgreSQL ``CREATE DATABASE … TEMPLATE``).

``database_url`` is a real SQLite file by default; a test (or module) marked ``both_stores``
runs on a real PostgreSQL server too (see ``pytest_generate_tests`` in tests/conftest.py):
the store is what those tests test. A test that asks for ``migrated_url`` (directly or
through ``database``, ``service``, ``http``…) starts from the migrated copy; one that asks
only for ``database_url`` gets an empty database, for the migrations' own tests."""

from __future__ import annotations

import functools
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
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


@functools.cache
def _sqlite_template() -> Path:
    """A SQLite file migrated to the head revision, once per test process."""
    path = Path(tempfile.mkdtemp(prefix="tuner-template-")) / "tuner.db"
    migrate.upgrade(f"sqlite:///{path}")
    # The last connection closed checkpoints the WAL: the file alone is the database.
    assert not path.with_name(path.name + "-wal").exists()
    return path


def migrated_sqlite(path: Path) -> str:
    """A SQLite database at ``path`` at the head revision (a copy of the template)."""
    shutil.copyfile(_sqlite_template(), path)
    return f"sqlite:///{path}"


@functools.cache
def _postgres_template(server_url: str) -> str:
    """The name of a database on ``server_url`` migrated to the head revision, once per
    test process; new databases are made from it with ``CREATE DATABASE … TEMPLATE``."""
    name = f"tuner_template_{uuid.uuid4().hex[:8]}"
    admin = _admin_engine(server_url)
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    migrate.upgrade(url)
    return name


def _admin_engine(server_url: str):  # type: ignore[no-untyped-def]
    return create_engine(
        make_url(server_url).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT"
    )


@contextmanager
def fresh_postgres_database(server_url: str, *, migrated: bool = False) -> Iterator[str]:
    """A new database on the PostgreSQL server at ``server_url``, dropped afterwards: empty,
    or ``migrated`` (a copy of the migrated template)."""
    template = f' TEMPLATE "{_postgres_template(server_url)}"' if migrated else ""
    admin = _admin_engine(server_url)
    name = f"tuner_{uuid.uuid4().hex[:12]}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"{template}'))
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _wants_migrated(request: pytest.FixtureRequest) -> bool:
    return "migrated_url" in request.fixturenames


@pytest.fixture
def sqlite_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    path = tmp_path / "tuner.db"
    return migrated_sqlite(path) if _wants_migrated(request) else f"sqlite:///{path}"


@pytest.fixture
def postgres_url(request: pytest.FixtureRequest, postgres_server: str) -> Iterator[str]:
    """A new database on the session's PostgreSQL server, dropped afterwards."""
    with fresh_postgres_database(postgres_server, migrated=_wants_migrated(request)) as url:
        yield url


@pytest.fixture
def database_url(request: pytest.FixtureRequest) -> str:
    """A fresh database of the kind the test is parametrized with (SQLite unless the test
    is marked ``both_stores``): migrated when the test asks for ``migrated_url`` too."""
    kind = getattr(request, "param", "sqlite")
    url: str = request.getfixturevalue(f"{kind}_url")
    return url


@pytest.fixture
def migrated_url(database_url: str) -> str:
    """``database_url``, at the head revision (made from the migrated template)."""
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
    url = migrated_sqlite(directory / "tuner.db")
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
def http(migrated_url: str, admin_token: str) -> Iterator[httpx.Client]:
    """A client of the service in this process, authenticated as admin: FastAPI's
    ``TestClient`` runs the real app and its lifespan with no socket. Tests whose subject
    is HTTP itself (connections, the client's retries, workers, security) use ``service``."""
    app = create_app(ServiceSettings(database_url=migrated_url))
    headers = {"Authorization": f"Bearer {admin_token}"}
    with TestClient(app, base_url="http://127.0.0.1", headers=headers) as client:
        yield client


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    """``tuner worker`` processes a test starts, all killed when it ends."""
    started = Workers(tmp_path)
    try:
        yield started
    finally:
        started.close()
