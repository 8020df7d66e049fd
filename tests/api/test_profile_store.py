"""A profile goes into the store whole and comes back equal, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from api import models
from api.db import Database
from api.store.profiles import add_profile, to_result
from tests.api.documents import sample_profile

# The store is the subject: SQLite and PostgreSQL.
pytestmark = pytest.mark.both_stores


def test_profile_round_trips_exactly(database: Database) -> None:
    profile = sample_profile()
    with database.session(write=True) as session:
        profile_id = add_profile(session, profile, project_id=1).id
    with database.session() as session:
        stored = to_result(session.get_one(models.Profile, profile_id))
    assert stored == profile


def test_a_failing_write_leaves_nothing_behind(database: Database) -> None:
    profile = sample_profile()

    class Interrupted(Exception):
        pass

    def write_then_fail() -> None:
        with database.session(write=True) as session:
            add_profile(session, profile, project_id=1)
            raise Interrupted

    with pytest.raises(Interrupted):
        write_then_fail()
    with database.session() as session:
        for table in (models.Profile, models.Probe, models.Device, models.Workload):
            assert session.scalar(select(func.count()).select_from(table)) == 0


def test_history_is_kept_and_devices_are_shared(database: Database) -> None:
    with database.session(write=True) as session:
        add_profile(session, sample_profile(max_micro_batch_size=8), project_id=1)
        add_profile(session, sample_profile(max_micro_batch_size=9), project_id=1)
    with database.session() as session:
        assert session.scalar(select(func.count()).select_from(models.Profile)) == 2
        assert session.scalar(select(func.count()).select_from(models.Device)) == 1
        assert session.scalar(select(func.count()).select_from(models.Workload)) == 1
