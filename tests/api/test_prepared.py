"""Prepared statements give what SQLAlchemy gives, on SQLite and on PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import bindparam, func, select

from api import models
from api.db import Database
from api.store.prepared import PreparedSelect
from api.store.profiles import add_profile
from tests.api.builders import at
from tests.api.documents import sample_profile


def test_rows_equal_sqlalchemys_own_values_and_types(database: Database) -> None:
    with database.session(write=True) as session:
        add_profile(session, sample_profile(max_micro_batch_size=8))
        add_profile(session, sample_profile(max_micro_batch_size=9, created_at=at(1)))
    profile, probe = models.Profile, models.Probe
    statement = (
        select(
            profile.id,
            profile.created_at,  # SQLite keeps text: it must come back an aware datetime
            profile.headroom,
            profile.fit_fixed_bytes,  # float, on PostgreSQL chosen by the driver's type code
            probe.fits,  # SQLite keeps 0/1: it must come back a bool
            probe.step_time_s,
            func.min(probe.micro_batch_size).over(partition_by=probe.profile_id),
        )
        .join(probe, probe.profile_id == profile.id)
        .where(profile.created_at >= bindparam("since"), probe.ordinal < bindparam("limit"))
        .order_by(profile.id, probe.ordinal)
    )
    parameters = {"since": at(0) - timedelta(seconds=1), "limit": 3}
    with database.engine.connect() as connection:
        expected = [tuple(row) for row in connection.execute(statement, parameters)]
        prepared = PreparedSelect(statement, database.engine.dialect)
        raw = connection.connection.driver_connection
        got = prepared.rows(raw, **parameters)
        again = prepared.rows(raw, **parameters)  # processors chosen once, then reused
    assert len(expected) > 2
    assert got == expected == again
    for mine, theirs in zip(got[0], expected[0], strict=True):
        assert type(mine) is type(theirs)
    assert got[0][1].tzinfo is not None


def test_a_missing_parameter_is_named(database: Database) -> None:
    statement = select(models.Device.id).where(models.Device.key == bindparam("key"))
    prepared = PreparedSelect(statement, database.engine.dialect)
    with database.engine.connect() as connection, pytest.raises(TypeError, match="key"):
        prepared.rows(connection.connection.driver_connection)


def test_statements_that_need_sqlalchemy_at_run_time_are_refused(database: Database) -> None:
    expanding = select(models.Device.id).where(models.Device.key.in_(bindparam("keys", [])))
    with pytest.raises(ValueError, match="post-compile"):
        PreparedSelect(expanding, database.engine.dialect)
