"""Revision 0012 on rows: profiles stored before it, variants included, are chosen by
nobody (the choice was not kept, and is never guessed); going back drops the mark and
keeps every profile and probe (profiles are altered in place: SQLite's batch mode would
cascade to the probes)."""

from __future__ import annotations

from api import migrate
from tests.api.test_migration_parallel import _rows_before_0004, _select
from tests.api.test_variants import GROUP, add_a_variant_row


def test_profiles_are_chosen_by_nobody_and_kept_both_ways(database_url: str) -> None:
    migrate.upgrade(database_url, "0003")
    _rows_before_0004(database_url)
    migrate.upgrade(database_url, "0011")
    add_a_variant_row(database_url)

    migrate.upgrade(database_url, "0012")
    marks = _select(database_url, "SELECT id, variant_chosen FROM profiles ORDER BY id")
    assert [(row_id, bool(chosen)) for row_id, chosen in marks] == [(1, False), (2, False)]
    assert _select(database_url, "SELECT COUNT(*) FROM probes") == [(2,)]

    migrate.downgrade(database_url, "0011")
    assert _select(database_url, "SELECT id, variant_group FROM profiles ORDER BY id") == [
        (1, None),
        (2, GROUP),
    ]
    assert _select(database_url, "SELECT COUNT(*) FROM probes") == [(2,)]
    migrate.upgrade(database_url)
    assert _select(database_url, "SELECT COUNT(*) FROM probes") == [(2,)]
