"""Rows as older schema revisions stored them, written with plain SQL, for the migrations'
tests (tests/api/test_migrations.py) and the tests of a revision kept beside its feature."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, text

from api.db import create_db_engine

WHEN = datetime(2026, 11, 1, tzinfo=UTC)


def insert_row(connection: Connection, table: str, **values: Any) -> None:
    names = ", ".join(values)
    marks = ", ".join(f":{name}" for name in values)
    connection.execute(text(f"INSERT INTO {table} ({names}) VALUES ({marks})"), values)


def profile_with_a_probe(
    connection: Connection,
    row_id: int,
    *,
    created_at: datetime,
    max_micro_batch_size: int,
    profile: dict[str, Any] | None = None,
    probe: dict[str, Any] | None = None,
) -> None:
    """A profile of workload 1 on device 1 and its probe at M*, with extra columns."""
    insert_row(
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
    insert_row(
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


def rows_before_0004(url: str) -> None:
    engine = create_db_engine(url)
    with engine.begin() as connection:
        insert_row(
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
        insert_row(
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
        profile_with_a_probe(connection, 1, created_at=WHEN, max_micro_batch_size=8)
    engine.dispose()


def query(url: str, sql: str) -> list[tuple[Any, ...]]:
    engine = create_db_engine(url)
    with engine.connect() as connection:
        rows = [tuple(row) for row in connection.execute(text(sql))]
    engine.dispose()
    return rows


def as_json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def report_row(url: str, row_id: int, **columns: object) -> None:
    engine = create_db_engine(url)
    with engine.begin() as connection:
        insert_row(
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
