"""Revision 0008 on rows: profiles stored before it are taken as received when they were
created; going back keeps every profile and its probes. Every revision since 0004 alters
profiles in place, so no probe is lost on the way up or down (SQLite's batch mode, which
copies and drops the table, would cascade to them)."""

from __future__ import annotations

from api import migrate
from tests.api.test_migration_parallel import WHEN, _rows_before_0004, _select


def test_profiles_are_backfilled_and_kept_both_ways(database_url: str) -> None:
    migrate.upgrade(database_url, "0003")
    _rows_before_0004(database_url)
    for revision in ("0004", "0005", "0006", "0007", "0008"):
        migrate.upgrade(database_url, revision)
        assert _select(database_url, "SELECT COUNT(*) FROM probes") == [(1,)], revision
    ((received,),) = _select(database_url, "SELECT received_at FROM profiles")
    assert received is not None
    assert str(received)[:19].replace("T", " ") == WHEN.strftime("%Y-%m-%d %H:%M:%S")
    for revision in ("0007", "0006", "0005", "0004"):
        migrate.downgrade(database_url, revision)
        assert _select(database_url, "SELECT COUNT(*) FROM probes") == [(1,)], revision
        assert _select(database_url, "SELECT id FROM profiles") == [(1,)]
    migrate.upgrade(database_url)
