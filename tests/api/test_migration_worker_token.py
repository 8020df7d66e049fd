"""Revision 0007 on rows: workers registered before it are bound to no token (any worker
token may act for them until they register again); going back keeps every worker."""

from __future__ import annotations

from api import migrate
from api.db import create_db_engine
from tests.api.test_migration_parallel import WHEN, _insert, _rows_before_0004, _select


def test_workers_keep_their_rows_both_ways(database_url: str) -> None:
    migrate.upgrade(database_url, "0003")
    _rows_before_0004(database_url)
    migrate.upgrade(database_url, "0006")
    engine = create_db_engine(database_url)
    with engine.begin() as connection:
        _insert(
            connection,
            "workers",
            id=1,
            name="gpu-host",
            device_id=1,
            registered_at=WHEN,
            last_heartbeat_at=WHEN,
        )
    engine.dispose()

    migrate.upgrade(database_url, "0007")
    assert _select(database_url, "SELECT id, name, token_id FROM workers") == [
        (1, "gpu-host", None)
    ]
    migrate.downgrade(database_url, "0006")
    assert _select(database_url, "SELECT id, name FROM workers") == [(1, "gpu-host")]
    migrate.upgrade(database_url)
