"""Revision 0010 on rows: workloads and devices stored before it have no registrant (their
names stay among themselves), a CPU device is renamed with its limit, a GPU only when it
ran under a limit below its card's memory, and going back restores the old names."""

from __future__ import annotations

import json

from api import migrate
from api.db import create_db_engine
from tests.api.test_migration_parallel import WHEN, _insert, _rows_before_0004, _select


def _gpus(url: str) -> None:
    engine = create_db_engine(url)
    with engine.begin() as connection:
        for row_id, limit in ((2, 40 * 2**30), (3, None)):
            details = {"total_memory_bytes": 80 * 2**30, "memory_limit_bytes": limit}
            _insert(
                connection, "devices", id=row_id, key=str(row_id) * 24, kind="cuda",
                name="NVIDIA H100 80GB HBM3", capacity_bytes=limit or 80 * 2**30,
                details=json.dumps(details), created_at=WHEN,
            )  # fmt: skip
    engine.dispose()


def test_devices_are_renamed_with_their_limit_and_back(database_url: str) -> None:
    migrate.upgrade(database_url, "0003")
    _rows_before_0004(database_url)  # device 1: a CPU device, 1 GiB
    migrate.upgrade(database_url, "0009")
    _gpus(database_url)
    before = _select(database_url, "SELECT id, name FROM devices ORDER BY id")

    migrate.upgrade(database_url, "0010")
    assert _select(database_url, "SELECT id, name FROM devices ORDER BY id") == [
        (1, "cpu-test (1 GiB limit)"),
        (2, "NVIDIA H100 80GB HBM3 (40 GiB limit)"),
        (3, "NVIDIA H100 80GB HBM3"),
    ]
    for table in ("workloads", "devices"):
        assert {row[0] for row in _select(database_url, f"SELECT registered_by FROM {table}")} == {
            None
        }
    assert _select(database_url, "SELECT COUNT(*) FROM probes") == [(1,)]

    migrate.downgrade(database_url, "0009")
    assert _select(database_url, "SELECT id, name FROM devices ORDER BY id") == before
    assert _select(database_url, "SELECT COUNT(*) FROM profiles") == [(1,)]
    migrate.upgrade(database_url)
    assert _select(database_url, "SELECT name FROM devices WHERE id = 1") == [
        ("cpu-test (1 GiB limit)",)
    ]
