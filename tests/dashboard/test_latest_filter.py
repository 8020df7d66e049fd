"""The profiles list filters "latest only" in the database (so it pages and counts there);
the rows it keeps are exactly those :func:`tuner.answer.current.superseded` calls current,
and each row's status says the same, on random histories (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from api.dashboard import queries
from api.db import Database
from api.store.evidence import SqlEvidence
from tests.api.builders import at
from tests.api.documents import sample_profile
from tests.dashboard.data import store
from tuner.answer import current
from tuner.core.parallel import Parallel

# The store is the subject: SQLite and PostgreSQL.
pytestmark = pytest.mark.both_stores

PAIRS = [("a" * 24, "d" * 24), ("a" * 24, "e" * 24), ("b" * 24, "d" * 24)]


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    history=st.lists(
        st.tuples(
            st.sampled_from(PAIRS), st.sampled_from([(1, 1), (2, 1), (4, 2)]), st.integers(0, 30)
        ),
        min_size=1,
        max_size=8,
    )
)
def test_latest_only_keeps_what_the_answer_calls_current(database: Database, history) -> None:
    with database.session(write=True) as session:
        for table in ("oom_reports", "probes", "profiles", "workloads", "devices"):
            session.execute(text(f"DELETE FROM {table}"))
    profiles = []
    for (workload, device), (world, tp), minute in history:
        mode = "fsdp" if world > 1 else "none"
        base = sample_profile(
            max_micro_batch_size=8,
            workload_key=(workload[:20] + mode).ljust(24, "x"),  # a key has one mode
            device_key=device,
            device_name=device[:4],
            workload_name=workload[:4],
            created_at=at(minute),  # measured out of order: "newest" is by receipt
        )
        parallel = Parallel(mode=mode, tp=tp, tp_plan="llama" if tp > 1 else None)  # type: ignore[arg-type]
        profiles.append(base.model_copy(update={"world_size": world, "parallel": parallel}))
    store(database, profiles)
    with database.session() as session:
        listed = queries.list_profiles(
            session, queries.ListQuery(latest_only=True, size=200), project_id=1
        )
        everything = queries.list_profiles(session, queries.ListQuery(size=200), project_id=1)
        heads = SqlEvidence(session, 1).profiles({row.workload_id for row in everything.rows})
    kept = {row.id for row in heads if not current.superseded(row, heads)}
    assert {row.id for row in listed.rows} == kept
    assert listed.count == len(kept)
    assert {row.id for row in everything.rows if not row.superseded} == kept
