"""One row by id (``api.store.rows.get_or_404``): each table's lookup answers its row, and
a missing id a NotFoundError (HTTP 404) in that table's own words, on SQLite and
PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy.orm import Session

from api.db import Database
from api.store.jobs import get_job, get_worker
from api.store.profiles import add_profile, get_device, get_profile, get_workload
from api.store.tokens import create_token, revoke_token
from tests.api.documents import sample_profile
from tuner.core.errors import NotFoundError

GETTERS: list[tuple[Callable[[Session, int], Any], str]] = [
    (get_worker, "no worker with id 999: register again with POST /api/v1/workers"),
    (get_job, "no job with id 999; GET /api/v1/jobs lists them"),
    (get_device, "no device with id 999: GET /api/v1/devices lists them"),
    (get_workload, "no workload with id 999: GET /api/v1/workloads lists them"),
    (get_profile, "no profile with id 999: GET /api/v1/profiles lists them"),
    (revoke_token, "no token with id 999; `tuner token list` shows them"),
]


@pytest.mark.parametrize(("get", "message"), GETTERS, ids=[g.__name__ for g, _ in GETTERS])
def test_a_missing_id_is_not_found_in_its_tables_words(
    database: Database, get: Callable[[Session, int], Any], message: str
) -> None:
    with database.session(write=True) as session, pytest.raises(NotFoundError) as raised:
        get(session, 999)
    assert raised.value.message == message


def test_a_stored_row_is_found_by_its_id(database: Database) -> None:
    with database.session(write=True) as session:
        profile = add_profile(session, sample_profile())
        ids = (profile.id, profile.device_id, profile.workload_id)
        token, _ = create_token(session, name="reader", scopes=["read"])
    with database.session(write=True) as session:
        assert get_profile(session, ids[0]).id == ids[0]
        assert get_device(session, ids[1]).id == ids[1]
        assert get_workload(session, ids[2]).id == ids[2]
        assert revoke_token(session, token.id).revoked_at is not None
