"""Revision 0018 on rows: probes stored before it have no timeline and their profiles
still load; a timeline written after it reads back; going back keeps every probe."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy import text

from api import migrate
from api.db import Database, create_db_engine
from api.store.profiles import get_profile, to_result
from tests.api.test_migration_parallel import _rows_before_0004, _select
from tests.timeline_profiles import measured_profile


def _columns(url: str) -> set[str]:
    engine = create_db_engine(url)
    try:
        return {c["name"] for c in sa.inspect(engine).get_columns("probes")}
    finally:
        engine.dispose()


def test_probes_gain_a_timeline_column_and_keep_their_rows_both_ways(database_url: str) -> None:
    migrate.upgrade(database_url, "0003")
    _rows_before_0004(database_url)
    migrate.upgrade(database_url, "0017")
    assert "timeline" not in _columns(database_url)

    migrate.upgrade(database_url, "0018")
    assert "timeline" in _columns(database_url)
    assert _select(database_url, "SELECT COUNT(*), COUNT(timeline) FROM probes") == [(1, 0)]

    migrate.upgrade(database_url)
    database = Database(database_url)
    try:
        with database.session() as session:
            (old,) = to_result(get_profile(session, 1, project_id=1)).probes
        assert old.timeline is None  # stored before timelines: it loads, without one

        measured = measured_profile().probe_at(measured_profile().max_micro_batch_size)
        assert measured is not None
        assert measured.timeline is not None
        engine = create_db_engine(database_url)
        with engine.begin() as connection:
            connection.execute(
                text("UPDATE probes SET timeline = :timeline"),
                {"timeline": measured.timeline.model_dump_json()},
            )
        engine.dispose()
        with database.session() as session:
            (probe,) = to_result(get_profile(session, 1, project_id=1)).probes
        assert probe.timeline == measured.timeline
    finally:
        database.dispose()

    migrate.downgrade(database_url, "0017")
    assert "timeline" not in _columns(database_url)
    assert _select(database_url, "SELECT COUNT(*) FROM probes") == [(1,)]
    assert _select(database_url, "SELECT id FROM profiles") == [(1,)]
    migrate.upgrade(database_url)
    assert _select(database_url, "SELECT COUNT(*), COUNT(timeline) FROM probes") == [(1, 0)]
