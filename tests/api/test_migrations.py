"""Migrations on real SQLite and PostgreSQL databases: upgrade, downgrade and upgrade again,
the models and the migrations agree, and each revision that moves rows keeps them both ways
(rows written with plain SQL as the older revision stored them: tests/api/migration_rows.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from api import migrate
from api.db import Database, create_db_engine
from api.models import Base
from api.store.profiles import get_profile, to_result
from tests.api.migration_rows import (
    WHEN,
    as_json,
    insert_row,
    profile_with_a_probe,
    query,
    report_row,
    rows_before_0004,
)
from tests.api.test_variants import GROUP, add_a_variant_row
from tests.timeline_profiles import measured_profile

pytestmark = pytest.mark.both_stores


def test_upgrade_downgrade_upgrade(database_url: str) -> None:
    migrate.upgrade(database_url)
    assert migrate.current_revision(database_url) == migrate.head_revision()
    engine = create_db_engine(database_url)
    assert set(Base.metadata.tables) <= set(inspect(engine).get_table_names())
    engine.dispose()

    migrate.downgrade(database_url, "base")
    assert migrate.current_revision(database_url) is None
    engine = create_db_engine(database_url)
    assert not set(Base.metadata.tables) & set(inspect(engine).get_table_names())
    engine.dispose()

    migrate.upgrade(database_url)
    assert migrate.current_revision(database_url) == migrate.head_revision()


def test_models_and_migrations_agree(migrated_url: str) -> None:
    engine = create_db_engine(migrated_url)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        differences = compare_metadata(context, Base.metadata)
    engine.dispose()
    assert differences == []


# Revision 0004 on rows: profiles stored before it become one-process profiles, and going
# back drops the multi-rank profiles that the older schema could not tell apart.


def test_rows_upgrade_as_one_process_and_multi_rank_rows_go_on_downgrade(
    database_url: str,
) -> None:
    migrate.upgrade(database_url, "0003")
    rows_before_0004(database_url)

    migrate.upgrade(database_url, "0004")
    [(world, mode, parallel)] = query(
        database_url, "SELECT world_size, parallel_mode, parallel FROM profiles"
    )
    assert (world, mode, as_json(parallel)) == (1, "none", {"mode": "none"})
    [(peaks, breakdowns)] = query(
        database_url, "SELECT rank_peaks_bytes, rank_breakdowns FROM probes"
    )
    assert (as_json(peaks), as_json(breakdowns)) == ([], [])
    assert query(database_url, "SELECT parallel_mode FROM workloads") == [("none",)]

    engine = create_db_engine(database_url)
    with engine.begin() as connection:  # a DDP profile at two ranks, stored under 0004
        profile_with_a_probe(
            connection,
            2,
            created_at=datetime(2026, 11, 2, tzinfo=UTC),
            max_micro_batch_size=6,
            profile={"world_size": 2, "parallel_mode": "ddp", "parallel": '{"mode": "ddp"}'},
            probe={"rank_peaks_bytes": "[10, 12]", "rank_breakdowns": "[]"},
        )
    engine.dispose()

    migrate.downgrade(database_url, "0003")
    assert migrate.current_revision(database_url) == "0003"
    assert query(database_url, "SELECT id, max_micro_batch_size FROM profiles") == [(1, 8)]
    assert query(database_url, "SELECT id, profile_id FROM probes") == [(1, 1)]

    migrate.upgrade(database_url)
    assert query(database_url, "SELECT id, world_size, parallel_mode FROM profiles") == [
        (1, 1, "none")
    ]


# Revision 0006 on rows: OOM reports stored before it have no settled size and no key;
# going back keeps every report and drops only the two columns.


def test_reports_keep_their_rows_both_ways(database_url: str) -> None:
    migrate.upgrade(database_url, "0003")
    rows_before_0004(database_url)
    migrate.upgrade(database_url, "0005")
    report_row(database_url, 1)

    migrate.upgrade(database_url, "0006")
    assert query(
        database_url,
        "SELECT id, micro_batch_size, settled_micro_batch_size, idempotency_key FROM oom_reports",
    ) == [(1, 12, None, None)]
    report_row(database_url, 2, settled_micro_batch_size=6, idempotency_key="event-0001")

    migrate.downgrade(database_url, "0005")
    assert query(database_url, "SELECT id, micro_batch_size FROM oom_reports ORDER BY id") == [
        (1, 12),
        (2, 12),
    ]
    engine = create_db_engine(database_url)
    with engine.connect() as connection:
        columns = connection.execute(text("SELECT * FROM oom_reports")).keys()
    engine.dispose()
    assert "idempotency_key" not in columns
    migrate.upgrade(database_url)


# Revision 0007 on rows: workers registered before it are bound to no token (any worker
# token may act for them until they register again); going back keeps every worker.


def test_workers_keep_their_rows_both_ways(database_url: str) -> None:
    migrate.upgrade(database_url, "0003")
    rows_before_0004(database_url)
    migrate.upgrade(database_url, "0006")
    engine = create_db_engine(database_url)
    with engine.begin() as connection:
        insert_row(
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
    assert query(database_url, "SELECT id, name, token_id FROM workers") == [(1, "gpu-host", None)]
    migrate.downgrade(database_url, "0006")
    assert query(database_url, "SELECT id, name FROM workers") == [(1, "gpu-host")]
    migrate.upgrade(database_url)


# Revision 0008 on rows: profiles stored before it are taken as received when they were
# created; going back keeps every profile and its probes. Every revision since 0004 alters
# profiles in place, so no probe is lost on the way up or down (SQLite's batch mode, which
# copies and drops the table, would cascade to them).


@pytest.mark.slow
def test_profiles_are_backfilled_and_kept_both_ways(database_url: str) -> None:
    migrate.upgrade(database_url, "0003")
    rows_before_0004(database_url)
    for revision in ("0004", "0005", "0006", "0007", "0008"):
        migrate.upgrade(database_url, revision)
        assert query(database_url, "SELECT COUNT(*) FROM probes") == [(1,)], revision
    ((received,),) = query(database_url, "SELECT received_at FROM profiles")
    assert received is not None
    assert str(received)[:19].replace("T", " ") == WHEN.strftime("%Y-%m-%d %H:%M:%S")
    for revision in ("0007", "0006", "0005", "0004"):
        migrate.downgrade(database_url, revision)
        assert query(database_url, "SELECT COUNT(*) FROM probes") == [(1,)], revision
        assert query(database_url, "SELECT id FROM profiles") == [(1,)]
    migrate.upgrade(database_url)


# Revision 0009 on rows: workloads stored before it keep every profile and probe, have
# no sequence length and no family (they answer for their own shape, as before), and going
# back drops the two columns without touching a profile (workloads are altered in place:
# profiles reference them, and SQLite's batch mode would cascade to them).


@pytest.mark.slow
def test_workloads_gain_no_length_and_keep_their_profiles_both_ways(database_url: str) -> None:
    migrate.upgrade(database_url, "0003")
    rows_before_0004(database_url)
    migrate.upgrade(database_url, "0009")
    assert query(database_url, "SELECT seq_len, length_family FROM workloads") == [(None, None)]
    assert query(database_url, "SELECT COUNT(*) FROM probes") == [(1,)]
    migrate.downgrade(database_url, "0008")
    assert query(database_url, "SELECT COUNT(*) FROM profiles") == [(1,)]
    assert query(database_url, "SELECT COUNT(*) FROM probes") == [(1,)]
    migrate.upgrade(database_url)
    assert query(database_url, "SELECT COUNT(*) FROM probes") == [(1,)]


# Revision 0010 on rows: workloads and devices stored before it have no registrant (their
# names stay among themselves), a CPU device is renamed with its limit, a GPU only when it
# ran under a limit below its card's memory, and going back restores the old names.


def _gpus(url: str) -> None:
    engine = create_db_engine(url)
    with engine.begin() as connection:
        for row_id, limit in ((2, 40 * 2**30), (3, None)):
            details = {"total_memory_bytes": 80 * 2**30, "memory_limit_bytes": limit}
            insert_row(
                connection, "devices", id=row_id, key=str(row_id) * 24, kind="cuda",
                name="NVIDIA H100 80GB HBM3", capacity_bytes=limit or 80 * 2**30,
                details=json.dumps(details), created_at=WHEN,
            )  # fmt: skip
    engine.dispose()


def test_devices_are_renamed_with_their_limit_and_back(database_url: str) -> None:
    migrate.upgrade(database_url, "0003")
    rows_before_0004(database_url)  # device 1: a CPU device, 1 GiB
    migrate.upgrade(database_url, "0009")
    _gpus(database_url)
    before = query(database_url, "SELECT id, name FROM devices ORDER BY id")

    migrate.upgrade(database_url, "0010")
    assert query(database_url, "SELECT id, name FROM devices ORDER BY id") == [
        (1, "cpu-test (1 GiB limit)"),
        (2, "NVIDIA H100 80GB HBM3 (40 GiB limit)"),
        (3, "NVIDIA H100 80GB HBM3"),
    ]
    for table in ("workloads", "devices"):
        assert {row[0] for row in query(database_url, f"SELECT registered_by FROM {table}")} == {
            None
        }
    assert query(database_url, "SELECT COUNT(*) FROM probes") == [(1,)]

    migrate.downgrade(database_url, "0009")
    assert query(database_url, "SELECT id, name FROM devices ORDER BY id") == before
    assert query(database_url, "SELECT COUNT(*) FROM profiles") == [(1,)]
    migrate.upgrade(database_url)
    assert query(database_url, "SELECT name FROM devices WHERE id = 1") == [
        ("cpu-test (1 GiB limit)",)
    ]


# Revision 0011 on rows: OOM reports keep their keys (under no token) going up, and
# jobs and workers gain empty keys; going back keeps every row, and of a key two tokens
# used, the first report keeps it (keys were unique across tokens before).


def test_keys_move_under_tokens_and_back(database_url: str) -> None:
    migrate.upgrade(database_url, "0003")
    rows_before_0004(database_url)
    migrate.upgrade(database_url, "0009")
    report_row(database_url, 1, idempotency_key="event-0001")

    migrate.upgrade(database_url, "0011")
    assert query(
        database_url, "SELECT id, token_id, idempotency_key, request_digest FROM oom_reports"
    ) == [(1, None, "event-0001", None)]
    # The same key from two tokens: two reports now.
    report_row(database_url, 2, idempotency_key="event-0002", token_id=7)
    report_row(database_url, 3, idempotency_key="event-0002", token_id=8)

    migrate.downgrade(database_url, "0009")
    assert query(database_url, "SELECT id, idempotency_key FROM oom_reports ORDER BY id") == [
        (1, "event-0001"),
        (2, "event-0002"),
        (3, None),
    ]
    migrate.upgrade(database_url)


# Revision 0012 on rows: profiles stored before it, variants included, are chosen by
# nobody (the choice was not kept, and is never guessed); going back drops the mark and
# keeps every profile and probe (profiles are altered in place: SQLite's batch mode would
# cascade to the probes).


def test_profiles_are_chosen_by_nobody_and_kept_both_ways(database_url: str) -> None:
    migrate.upgrade(database_url, "0003")
    rows_before_0004(database_url)
    migrate.upgrade(database_url, "0011")
    add_a_variant_row(database_url)

    migrate.upgrade(database_url, "0012")
    marks = query(database_url, "SELECT id, variant_chosen FROM profiles ORDER BY id")
    assert [(row_id, bool(chosen)) for row_id, chosen in marks] == [(1, False), (2, False)]
    assert query(database_url, "SELECT COUNT(*) FROM probes") == [(2,)]

    migrate.downgrade(database_url, "0011")
    assert query(database_url, "SELECT id, variant_group FROM profiles ORDER BY id") == [
        (1, None),
        (2, GROUP),
    ]
    assert query(database_url, "SELECT COUNT(*) FROM probes") == [(2,)]
    migrate.upgrade(database_url)
    assert query(database_url, "SELECT COUNT(*) FROM probes") == [(2,)]


# Revision 0015 on rows: everything stored before belongs to the project ``default``,
# tokens too but admin tokens (every project); on SQLite the rebuilt ``workloads`` and
# ``devices`` tables keep every profile and probe that refers to them (with foreign keys
# on, the rebuild would have cascaded to them); a key is then unique per project only; and
# going back keeps every row.


def _tokens(url: str) -> None:
    engine = create_db_engine(url)
    with engine.begin() as connection:
        for row_id, scopes in ((1, "read,write"), (2, "admin"), (3, "worker")):
            insert_row(
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
    rows_before_0004(database_url)
    migrate.upgrade(database_url, "0014")
    _tokens(database_url)
    probes_before = query(database_url, "SELECT id, profile_id FROM probes ORDER BY id")
    assert probes_before

    migrate.upgrade(database_url, "0015")
    assert query(database_url, "SELECT id, name FROM projects") == [(1, "default")]
    for table in ("workloads", "devices"):
        assert query(database_url, f"SELECT id, project_id FROM {table}") == [(1, 1)]
    assert query(database_url, "SELECT id, workload_id, device_id FROM profiles") == [(1, 1, 1)]
    assert query(database_url, "SELECT id, profile_id FROM probes ORDER BY id") == probes_before
    assert query(database_url, "SELECT id, project_id FROM api_tokens ORDER BY id") == [
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
    assert query(database_url, "SELECT id, workload_id, device_id FROM profiles") == [(1, 1, 1)]
    assert query(database_url, "SELECT id, profile_id FROM probes ORDER BY id") == probes_before
    migrate.upgrade(database_url)


def _workload(connection: object, row_id: int, *, project_id: int) -> None:
    insert_row(
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


# Revision 0018 on rows: probes stored before it have no timeline and their profiles
# still load; a timeline written after it reads back; going back keeps every probe.


def _columns(url: str) -> set[str]:
    engine = create_db_engine(url)
    try:
        return {c["name"] for c in sa.inspect(engine).get_columns("probes")}
    finally:
        engine.dispose()


@pytest.mark.slow
def test_probes_gain_a_timeline_column_and_keep_their_rows_both_ways(database_url: str) -> None:
    migrate.upgrade(database_url, "0003")
    rows_before_0004(database_url)
    migrate.upgrade(database_url, "0017")
    assert "timeline" not in _columns(database_url)

    migrate.upgrade(database_url, "0018")
    assert "timeline" in _columns(database_url)
    assert query(database_url, "SELECT COUNT(*), COUNT(timeline) FROM probes") == [(1, 0)]

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
    assert query(database_url, "SELECT COUNT(*) FROM probes") == [(1,)]
    assert query(database_url, "SELECT id FROM profiles") == [(1,)]
    migrate.upgrade(database_url)
    assert query(database_url, "SELECT COUNT(*), COUNT(timeline) FROM probes") == [(1, 0)]
