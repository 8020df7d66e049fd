"""Revision 0006 on rows: OOM reports stored before it have no settled size and no key;
going back keeps every report and drops only the two columns."""

from __future__ import annotations

from sqlalchemy import text

from api import migrate
from api.db import create_db_engine
from tests.api.test_migration_parallel import WHEN, _insert, _rows_before_0004, _select


def _report(url: str, row_id: int, **columns: object) -> None:
    engine = create_db_engine(url)
    with engine.begin() as connection:
        _insert(
            connection,
            "oom_reports",
            id=row_id,
            workload_id=1,
            device_id=1,
            micro_batch_size=12,
            message="CUDA out of memory",
            created_at=WHEN,
            **columns,
        )
    engine.dispose()


def test_reports_keep_their_rows_both_ways(database_url: str) -> None:
    migrate.upgrade(database_url, "0003")
    _rows_before_0004(database_url)
    migrate.upgrade(database_url, "0005")
    _report(database_url, 1)

    migrate.upgrade(database_url, "0006")
    assert _select(
        database_url,
        "SELECT id, micro_batch_size, settled_micro_batch_size, idempotency_key FROM oom_reports",
    ) == [(1, 12, None, None)]
    _report(database_url, 2, settled_micro_batch_size=6, idempotency_key="event-0001")

    migrate.downgrade(database_url, "0005")
    assert _select(database_url, "SELECT id, micro_batch_size FROM oom_reports ORDER BY id") == [
        (1, 12),
        (2, 12),
    ]
    engine = create_db_engine(database_url)
    with engine.connect() as connection:
        columns = connection.execute(text("SELECT * FROM oom_reports")).keys()
    engine.dispose()
    assert "idempotency_key" not in columns
    migrate.upgrade(database_url)
