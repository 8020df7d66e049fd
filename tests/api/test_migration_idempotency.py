"""Revision 0011 on rows: OOM reports keep their keys (under no token) going up, and
jobs and workers gain empty keys; going back keeps every row, and of a key two tokens
used, the first report keeps it (keys were unique across tokens before)."""

from __future__ import annotations

from api import migrate
from tests.api.test_migration_oom_reports import _report
from tests.api.test_migration_parallel import _rows_before_0004, _select


def test_keys_move_under_tokens_and_back(database_url: str) -> None:
    migrate.upgrade(database_url, "0003")
    _rows_before_0004(database_url)
    migrate.upgrade(database_url, "0009")
    _report(database_url, 1, idempotency_key="event-0001")

    migrate.upgrade(database_url, "0011")
    assert _select(
        database_url, "SELECT id, token_id, idempotency_key, request_digest FROM oom_reports"
    ) == [(1, None, "event-0001", None)]
    # The same key from two tokens: two reports now.
    _report(database_url, 2, idempotency_key="event-0002", token_id=7)
    _report(database_url, 3, idempotency_key="event-0002", token_id=8)

    migrate.downgrade(database_url, "0009")
    assert _select(database_url, "SELECT id, idempotency_key FROM oom_reports ORDER BY id") == [
        (1, "event-0001"),
        (2, "event-0002"),
        (3, None),
    ]
    migrate.upgrade(database_url)
