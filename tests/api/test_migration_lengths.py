"""Revision 0009 on rows: workloads stored before it keep every profile and probe, have
no sequence length and no family (they answer for their own shape, as before), and going
back drops the two columns without touching a profile (workloads are altered in place:
profiles reference them, and SQLite's batch mode would cascade to them)."""

from __future__ import annotations

from api import migrate
from tests.api.test_migration_parallel import _rows_before_0004, _select


def test_workloads_gain_no_length_and_keep_their_profiles_both_ways(database_url: str) -> None:
    migrate.upgrade(database_url, "0003")
    _rows_before_0004(database_url)
    migrate.upgrade(database_url, "0009")
    assert _select(database_url, "SELECT seq_len, length_family FROM workloads") == [(None, None)]
    assert _select(database_url, "SELECT COUNT(*) FROM probes") == [(1,)]
    migrate.downgrade(database_url, "0008")
    assert _select(database_url, "SELECT COUNT(*) FROM profiles") == [(1,)]
    assert _select(database_url, "SELECT COUNT(*) FROM probes") == [(1,)]
    migrate.upgrade(database_url)
    assert _select(database_url, "SELECT COUNT(*) FROM probes") == [(1,)]
