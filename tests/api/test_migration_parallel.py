"""Revision 0004 on rows: profiles stored before it become one-process profiles, and going
back drops the multi-rank profiles that the older schema could not tell apart."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, text

from api import migrate
from api.db import create_db_engine

WHEN = datetime(2026, 11, 1, tzinfo=UTC)


def _insert(connection: Connection, table: str, **values: Any) -> None:
    names = ", ".join(values)
    marks = ", ".join(f":{name}" for name in values)
    connection.execute(text(f"INSERT INTO {table} ({names}) VALUES ({marks})"), values)


def _profile_with_a_probe(
    connection: Connection,
    row_id: int,
    *,
    created_at: datetime,
    max_micro_batch_size: int,
    profile: dict[str, Any] | None = None,
    probe: dict[str, Any] | None = None,
) -> None:
    """A profile of workload 1 on device 1 and its probe at M*, with extra columns."""
    _insert(
        connection,
        "profiles",
        id=row_id,
        workload_id=1,
        device_id=1,
        created_at=created_at,
        headroom=0.05,
        budget_bytes=2**29,
        strategy="model",
        size_cap=64,
        max_micro_batch_size=max_micro_batch_size,
        settings="{}",
        wall_time_s=1.0,
        **(profile or {}),
    )
    _insert(
        connection,
        "probes",
        id=row_id,
        profile_id=row_id,
        ordinal=0,
        micro_batch_size=max_micro_batch_size,
        fits=True,
        oom=False,
        non_torch_bytes=0,
        alloc_retries=0,
        phase_peaks_bytes="{}",
        steps_run=3,
        wall_time_s=0.1,
        **(probe or {}),
    )


def _rows_before_0004(url: str) -> None:
    engine = create_db_engine(url)
    with engine.begin() as connection:
        _insert(
            connection,
            "devices",
            id=1,
            key="d" * 24,
            kind="cpu",
            name="cpu-test",
            capacity_bytes=2**30,
            details="{}",
            created_at=WHEN,
        )
        _insert(
            connection,
            "workloads",
            id=1,
            key="w" * 24,
            name="gpt-test",
            target=None,
            precision="fp32",
            activation_checkpointing=False,
            parameter_count=10,
            optimizer="AdamW",
            created_at=WHEN,
        )
        _profile_with_a_probe(connection, 1, created_at=WHEN, max_micro_batch_size=8)
    engine.dispose()


def _select(url: str, sql: str) -> list[tuple[Any, ...]]:
    engine = create_db_engine(url)
    with engine.connect() as connection:
        rows = [tuple(row) for row in connection.execute(text(sql))]
    engine.dispose()
    return rows


def _as_json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def test_rows_upgrade_as_one_process_and_multi_rank_rows_go_on_downgrade(
    database_url: str,
) -> None:
    migrate.upgrade(database_url, "0003")
    _rows_before_0004(database_url)

    migrate.upgrade(database_url, "0004")
    [(world, mode, parallel)] = _select(
        database_url, "SELECT world_size, parallel_mode, parallel FROM profiles"
    )
    assert (world, mode, _as_json(parallel)) == (1, "none", {"mode": "none"})
    [(peaks, breakdowns)] = _select(
        database_url, "SELECT rank_peaks_bytes, rank_breakdowns FROM probes"
    )
    assert (_as_json(peaks), _as_json(breakdowns)) == ([], [])
    assert _select(database_url, "SELECT parallel_mode FROM workloads") == [("none",)]

    engine = create_db_engine(database_url)
    with engine.begin() as connection:  # a DDP profile at two ranks, stored under 0004
        _profile_with_a_probe(
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
    assert _select(database_url, "SELECT id, max_micro_batch_size FROM profiles") == [(1, 8)]
    assert _select(database_url, "SELECT id, profile_id FROM probes") == [(1, 1)]

    migrate.upgrade(database_url)
    assert _select(database_url, "SELECT id, world_size, parallel_mode FROM profiles") == [
        (1, 1, "none")
    ]
