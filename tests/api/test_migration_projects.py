"""Revision 0015 on rows: everything stored before belongs to the project ``default``,
tokens too but admin tokens (every project); on SQLite the rebuilt ``workloads`` and
``devices`` tables keep every profile and probe that refers to them (with foreign keys
on, the rebuild would have cascaded to them); a key is then unique per project only; and
going back keeps every row."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from api import migrate
from api.db import create_db_engine
from tests.api.test_migration_parallel import WHEN, _insert, _rows_before_0004, _select


def _tokens(url: str) -> None:
    engine = create_db_engine(url)
    with engine.begin() as connection:
        for row_id, scopes in ((1, "read,write"), (2, "admin"), (3, "worker")):
            _insert(
                connection,
                "api_tokens",
                id=row_id,
                name=f"token-{row_id}",
                prefix=f"mbt_{row_id}",
                digest=str(row_id) * 64,
                scopes=scopes,
                created_at=WHEN,
            )
    engine.dispose()


def test_rows_move_into_default_and_keep_their_references(database_url: str) -> None:
    migrate.upgrade(database_url, "0003")
    _rows_before_0004(database_url)
    migrate.upgrade(database_url, "0014")
    _tokens(database_url)
    probes_before = _select(database_url, "SELECT id, profile_id FROM probes ORDER BY id")
    assert probes_before

    migrate.upgrade(database_url, "0015")
    assert _select(database_url, "SELECT id, name FROM projects") == [(1, "default")]
    for table in ("workloads", "devices"):
        assert _select(database_url, f"SELECT id, project_id FROM {table}") == [(1, 1)]
    assert _select(database_url, "SELECT id, workload_id, device_id FROM profiles") == [(1, 1, 1)]
    assert _select(database_url, "SELECT id, profile_id FROM probes ORDER BY id") == probes_before
    assert _select(database_url, "SELECT id, project_id FROM api_tokens ORDER BY id") == [
        (1, 1),
        (2, None),
        (3, 1),
    ]

    # A key is unique within a project, no longer across the store.
    engine = create_db_engine(database_url)
    with engine.begin() as connection:
        _workload(connection, 2, project_id=2)
    with pytest.raises(IntegrityError), engine.begin() as connection:
        _workload(connection, 3, project_id=2)
    with engine.begin() as connection:
        connection.execute(text("DELETE FROM workloads WHERE id = 2"))
    engine.dispose()

    migrate.downgrade(database_url, "0014")
    assert _select(database_url, "SELECT id, workload_id, device_id FROM profiles") == [(1, 1, 1)]
    assert _select(database_url, "SELECT id, profile_id FROM probes ORDER BY id") == probes_before
    migrate.upgrade(database_url)


def _workload(connection: object, row_id: int, *, project_id: int) -> None:
    _insert(
        connection,  # type: ignore[arg-type]
        "workloads",
        id=row_id,
        project_id=project_id,
        key="w" * 24,  # the key of workload 1, in project default
        name="gpt-test",
        precision="fp32",
        activation_checkpointing=False,
        parameter_count=10,
        optimizer="AdamW",
        created_at=WHEN,
    )
